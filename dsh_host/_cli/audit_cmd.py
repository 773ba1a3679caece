"""``dsh audit verify FILE | keygen``: check an attested export offline, make a signing key.

``verify`` needs no composition, no session store and no plugin: the export carries the events,
the chain and the signature (see :mod:`dsh_host._session.audit`). Exit codes: 0 every check
passed, 1 the file was read and at least one check failed (each problem is printed with its
record index and seq), 2 usage (no such file, a bad ``--public-key``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from .common import CliUsageError


def add_parser(sub: Any) -> None:
    audit = sub.add_parser(
        "audit",
        help="check an attested session export offline (`dsh sessions export ID --attest`)",
    )
    commands = audit.add_subparsers(dest="audit_command", metavar="SUBCOMMAND")
    audit.set_defaults(handler=lambda args: (audit.print_help(), 2)[1])

    verify = commands.add_parser(
        "verify",
        help="check an export's hash chain, signature, call/result pairing and approvals: "
        "0 valid, 1 problems found, 2 usage",
    )
    verify.add_argument("file", metavar="FILE", help="the export (`-` reads stdin)")
    verify.add_argument(
        "--public-key",
        metavar="KEY",
        help="the signer's public key you trust (base64 of 32 bytes as `dsh audit keygen` "
        "prints, a PEM file, or a file holding the base64); without it the embedded key is used "
        "and the report says which key that was",
    )
    verify.add_argument("--json", action="store_true", help="print one JSON object")
    verify.set_defaults(handler=run_verify)

    keygen = commands.add_parser(
        "keygen", help="make the signing key (0600) if there is none, and print its public key"
    )
    keygen.add_argument(
        "--key",
        metavar="FILE",
        help="where (default: ~/.config/dsh/audit-ed25519.pem)",
    )
    keygen.set_defaults(handler=run_keygen)


def _public_key_argument(value: str | None) -> str | None:
    if value is None:
        return None
    path = Path(value).expanduser()
    if path.is_file():
        try:
            return path.read_text(encoding="ascii")
        except (OSError, UnicodeError) as exc:
            raise CliUsageError(f"--public-key {value}: cannot read it ({exc})") from None
    return value


def run_verify(args: argparse.Namespace) -> int:
    from .._session.audit import verify_export

    public_key = _public_key_argument(args.public_key)
    try:
        # Line by line, never whole: a 100k-event export is checked in bounded memory (D33).
        if args.file == "-":
            report = verify_export(sys.stdin.buffer, public_key=public_key)
        else:
            with open(args.file, "rb") as lines:
                report = verify_export(lines, public_key=public_key)
    except OSError as exc:
        raise CliUsageError(f"{args.file}: cannot read it ({exc.strerror})") from None
    if args.json:
        print(json.dumps(report.to_json()))
        return 0 if report.ok else 1
    if report.ok:
        who = (
            "the trusted key"
            if report.signed_by_trusted_key
            else (
                f"the key embedded in the file, {report.public_key} (pass --public-key to require "
                "yours)"
            )
        )
        print(
            f"{args.file}: valid: {report.events} events of session {report.session_id}; "
            f"chain intact, signed by {who}; every result has its call, every approval its "
            "decision, nothing ran after a denial"
        )
        return 0
    print(f"dsh: {args.file}: NOT VALID: {len(report.problems)} problem(s)", file=sys.stderr)
    for problem in report.problems:
        print(f"  {problem}", file=sys.stderr)
    return 1


def run_keygen(args: argparse.Namespace) -> int:
    from .._session.audit import default_key_file, load_or_create_key, public_key_text

    path = Path(args.key).expanduser() if args.key else default_key_file()
    existed = path.exists()
    key = load_or_create_key(path)
    print(public_key_text(key))
    print(
        f"dsh: {'kept the existing' if existed else 'made a new'} signing key {path}",
        file=sys.stderr,
    )
    return 0
