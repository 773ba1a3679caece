"""A provable audit export of one session: a hash-chained, signed file that verifies offline.

``dsh sessions export ID --attest`` turns a stored log into an *attested export*; ``dsh audit
verify FILE`` checks one on any machine, with no session store, no composition and no plugin:
everything it needs is in the file (and, to bind it to a signer, the public key you trust).

The file is JSON Lines, one record per line, each in the canonical form
:func:`canonical_json` defines (so the file's bytes *are* what is hashed):

* record 0, ``{"record": "header", "format", "sessionId", "header", "index": 0, "prev", "hash"}``:
  the session header;
* records 1..n, ``{"record": "event", "index", "event", "prev", "hash"}``: every stored event,
  in log order, as the log's own JSON (``type``, ``seq``, ``time``, ``data``, ...);
* the last, ``{"record": "signature", "index", "format", "sessionId", "events", "finalHash",
  "algorithm": "ed25519", "publicKey", "signature"}``.

``hash`` of a chained record is the lower-case hex SHA-256 of the canonical form of the record
*without* its ``hash`` member; ``prev`` is the previous record's ``hash`` (64 zeros for record
0). The index and ``prev`` are inside what is hashed, so a changed byte, a dropped record or two
swapped ones change every later hash. The Ed25519 signature covers the canonical form of
``{"format", "sessionId", "events", "finalHash"}``: the last hash pins every record before it,
so one signature pins the whole file, and a file cut short no longer ends with the hash that
was signed.

A chain and a signature prove that the file is what the holder of the key exported; they do not
prove the log was truthful. So the verifier also checks the promises the log makes, which any
reader can check without trusting the exporter's code:

* a ``tool/result`` answers an earlier durable ``tool/call`` with the same call id (the
  checkpoint policy records the call before its body runs), unless it is crash repair's honest
  ``TOOL_NOT_STARTED`` closer, which by definition answers a call that was never recorded;
* every ``approval/asked`` bound to a call is answered by its ``approval/decided`` (same ask id)
  before any result of that call, after the ask, with the same ``argsDigest`` and the same
  context (sandbox mode, network, tool and composition digests) where both recorded one; and the
  asked digest is the SHA-256 of the arguments the call's ``tool/call`` logged;
* after a decision that was not ``allowed-once``, nothing of that call ran: its result is an
  error (the rejection). The turn that applies a deferred rejection logs the call's
  ``tool/call`` again before it records the rejection as its result, so a ``tool/call`` alone
  is no evidence of a run; a successful result is;
* seqs start at 0 and climb by one (a dropped event shows even in a re-chained file).

Each problem names the record index and the event's seq. The semantic checks run on the
records as read, so a tampering that re-computed the chain and re-signed with another key is
still caught where it broke a promise; the signature check says whose key signed, and
``--public-key`` refuses any other.

Canonical form: JSON with object members sorted by key (code point order), no whitespace,
every non-ASCII character (and a lone surrogate a model may emit) escaped as ``\\uXXXX`` so every
string has exactly one spelling and the file is plain ASCII, integers as digits, other numbers
as Python's shortest round-trip ``repr``; NaN and infinities are refused. It follows RFC 8785's
idea (sorted keys, no insignificant whitespace) but escapes non-ASCII instead of writing UTF-8.

The signing key is an Ed25519 private key in a PKCS#8 PEM file, by default
``$XDG_CONFIG_HOME/dsh/audit-ed25519.pem`` (:func:`default_key_file`), created ``0600`` on first
use. It never enters the log and no tool runs in the process that signs; that default path is
also one of the harness's secrets every sandbox hides from confined calls
(:func:`dsh_host._sandbox.harness_secret_paths`), so a tool cannot read it to forge an export.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import math
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, cast

from dsh_host._sandbox import AUDIT_KEY_NAME
from dsh_host._session.approvals import args_digest
from dsh_host._session.repair import TOOL_NOT_STARTED
from dsh_host._userdirs import config_home
from dsh_host.errors import DshError, MissingExtraError

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (
        Ed25519PrivateKey,
        Ed25519PublicKey,
    )

__all__ = [
    "AUDIT_FORMAT",
    "AuditError",
    "AuditProblem",
    "AuditReport",
    "attest",
    "canonical_json",
    "default_key_file",
    "load_or_create_key",
    "load_public_key",
    "public_key_text",
    "verify_export",
]

#: The ``format`` of an attested export (a verifier refuses any other).
AUDIT_FORMAT: Final = "dsh-audit-export/1"
#: ``prev`` of record 0.
GENESIS: Final = "0" * 64


class AuditError(DshError):
    """An export cannot be made or read: a key file, a public key or a file that is no export."""

    code = "AUDIT"
    exit_code = 2


def default_key_file() -> Path:
    """The default signing key: ``$XDG_CONFIG_HOME/dsh/audit-ed25519.pem``."""
    return config_home() / "dsh" / AUDIT_KEY_NAME


# -- canonical form and hashes ------------------------------------------------------------


def _check_numbers(value: Any, where: str) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise AuditError(f"{where}: {value!r} has no canonical JSON form")
    if isinstance(value, Mapping):
        for key, item in value.items():
            _check_numbers(item, f"{where}.{key}")
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            _check_numbers(item, f"{where}[{i}]")


def canonical_json(value: Any) -> bytes:
    """The canonical bytes of a JSON value (see the module docstring)."""
    _check_numbers(value, "$")
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
    ).encode("ascii")


def _record_hash(record: Mapping[str, Any]) -> str:
    body = {k: v for k, v in record.items() if k != "hash"}
    return hashlib.sha256(canonical_json(body)).hexdigest()


def _signed_message(session_id: Any, events: Any, final_hash: Any) -> bytes:
    return canonical_json(
        {"format": AUDIT_FORMAT, "sessionId": session_id, "events": events, "finalHash": final_hash}
    )


# -- keys ---------------------------------------------------------------------------------


def _crypto() -> Any:
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError as exc:
        raise MissingExtraError("audit", "cryptography") from exc
    return serialization, ed25519


def load_or_create_key(path: Path | None = None, *, create: bool = True) -> Ed25519PrivateKey:
    """The Ed25519 signing key at ``path`` (default :func:`default_key_file`).

    Missing and ``create``: a new key is written there, ``0600``, its directory made ``0700``
    (``O_EXCL``: two first uses at once never overwrite each other's key). A key file that
    others may read or write is refused, as ssh refuses one: the signature is only worth the
    secrecy of the key.
    """
    serialization, ed25519 = _crypto()
    key_path = path if path is not None else default_key_file()
    if not key_path.exists():
        if not create:
            raise AuditError(f"{key_path}: no signing key there (`dsh audit keygen` makes one)")
        key_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        key: Ed25519PrivateKey = ed25519.Ed25519PrivateKey.generate()
        pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        try:
            fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return load_or_create_key(key_path, create=False)  # another process made it first
        with os.fdopen(fd, "wb") as out:
            out.write(pem)
            out.flush()
            os.fsync(out.fileno())
        return key
    mode = key_path.stat().st_mode & 0o777
    if mode & 0o077:
        raise AuditError(
            f"{key_path}: the signing key is readable or writable by others (mode "
            f"{mode:04o}); run `chmod 600 {key_path}`"
        )
    try:
        loaded = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except (ValueError, TypeError) as exc:
        raise AuditError(f"{key_path}: not an unencrypted PEM private key ({exc})") from None
    if not isinstance(loaded, ed25519.Ed25519PrivateKey):
        raise AuditError(f"{key_path}: the key is not an Ed25519 key")
    return cast("Ed25519PrivateKey", loaded)


def public_key_text(key: Ed25519PrivateKey | Ed25519PublicKey) -> str:
    """The public key as base64 of its 32 raw bytes (what an export embeds and prints)."""
    serialization, ed25519 = _crypto()
    public: Any = key.public_key() if isinstance(key, ed25519.Ed25519PrivateKey) else key
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return base64.b64encode(raw).decode("ascii")


def load_public_key(text: str, where: str = "public key") -> Ed25519PublicKey:
    """A public key from base64 of its 32 raw bytes, or a PEM ``PUBLIC KEY`` block."""
    serialization, ed25519 = _crypto()
    stripped = text.strip()
    try:
        if stripped.startswith("-----BEGIN"):
            public = serialization.load_pem_public_key(stripped.encode("ascii"))
            if not isinstance(public, ed25519.Ed25519PublicKey):
                raise AuditError(f"{where}: not an Ed25519 public key")
            return public  # type: ignore[no-any-return]
        raw = base64.b64decode(stripped, validate=True)
        return ed25519.Ed25519PublicKey.from_public_bytes(raw)  # type: ignore[no-any-return]
    except (ValueError, TypeError, UnicodeError) as exc:
        raise AuditError(
            f"{where}: not an Ed25519 public key (base64 of 32 bytes, or PEM): {exc}"
        ) from None


# -- export -------------------------------------------------------------------------------


def attest(
    session_id: str,
    header: Mapping[str, Any],
    events: Iterable[Mapping[str, Any]],
    key: Ed25519PrivateKey,
) -> bytes:
    """The attested export of a log: its header and events (the log's JSON), chained and signed.

    Pure: the same log and key always give the same bytes (Ed25519 signatures are
    deterministic), so two exports of an unchanged log compare equal.
    """
    return b"".join(attest_lines(session_id, header, events, key))


def attest_lines(
    session_id: str,
    header: Mapping[str, Any],
    events: Iterable[Mapping[str, Any]],
    key: Ed25519PrivateKey,
) -> Iterator[bytes]:
    """:func:`attest` one line at a time (each with its newline), ``events`` walked once: a
    log read page by page is exported holding a page (D33)."""
    prev = GENESIS
    records: Iterator[dict[str, Any]] = itertools.chain(
        (
            {
                "record": "header",
                "format": AUDIT_FORMAT,
                "sessionId": session_id,
                "header": dict(header),
            },
        ),
        ({"record": "event", "event": dict(event)} for event in events),
    )
    index = 0
    for index, record in enumerate(records):
        record["index"] = index
        record["prev"] = prev
        prev = record["hash"] = _record_hash(record)
        yield canonical_json(record) + b"\n"
    count = index  # the header is record 0
    signature = key.sign(_signed_message(session_id, count, prev))
    yield canonical_json(
        {
            "record": "signature",
            "index": count + 1,
            "format": AUDIT_FORMAT,
            "sessionId": session_id,
            "events": count,
            "finalHash": prev,
            "algorithm": "ed25519",
            "publicKey": public_key_text(key),
            "signature": base64.b64encode(signature).decode("ascii"),
        }
    ) + b"\n"


# -- verify -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AuditProblem:
    """One broken promise: where (record index, event seq) and what."""

    index: int  #: the record's line, 0 = the header record
    seq: int | None  #: the event's seq, when the record is an event that has one
    kind: str  #: a stable name: ``chain``, ``signature``, ``result-without-call``, ...
    message: str

    def __str__(self) -> str:
        at = f"record {self.index}" + (f" (seq {self.seq})" if self.seq is not None else "")
        return f"{at}: {self.kind}: {self.message}"

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "seq": self.seq, "kind": self.kind, "message": self.message}


@dataclass(slots=True)
class AuditReport:
    """What :func:`verify_export` found. ``ok`` only with no problem at all."""

    session_id: str | None = None
    events: int = 0
    public_key: str | None = None  #: the key the signature was checked with (base64)
    signed_by_trusted_key: bool = False  #: ``--public-key`` given and it signed the file
    problems: list[AuditProblem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "sessionId": self.session_id,
            "events": self.events,
            "publicKey": self.public_key,
            "trustedKey": self.signed_by_trusted_key,
            "problems": [p.to_json() for p in self.problems],
        }


def verify_export(
    data: bytes | Iterable[bytes], *, public_key: str | None = None
) -> AuditReport:
    """Check an attested export offline: chain, signature, and the log's promises.

    ``data``: the export's bytes, or its lines (an open file: it is read once, line by line, and
    only what the checks need is kept, so a 100k-event export is checked in bounded memory, D33).
    ``public_key`` (base64 or PEM): the key you trust; without it the key embedded in the file
    is used, which proves integrity but not who signed (the report says which key it was).
    Never raises for a damaged file: every problem is in the report. A bad ``public_key``
    raises :class:`AuditError`.
    """
    trusted = load_public_key(public_key, "--public-key") if public_key is not None else None
    report = AuditReport()
    problems = report.problems
    tail = _Tail()
    records = _check_chain(tail.watch(_parse_lines(_lines(data), problems)), report)
    events = (
        (i, r["event"])
        for i, r in records
        if r.get("record") == "event" and isinstance(r.get("event"), Mapping)
    )
    _check_promises(_check_seqs(events, report), problems)
    if tail.last is None:
        if not problems:
            problems.append(AuditProblem(0, None, "format", "the file holds no record"))
        return report
    _check_signature(tail.last, tail.chained, report, trusted)
    problems.sort(key=lambda p: p.index)
    return report


def _lines(data: bytes | Iterable[bytes]) -> Iterator[bytes]:
    """The export's lines without their newline (none after the final newline)."""
    if isinstance(data, bytes):
        lines = data.split(b"\n")
        if lines and lines[-1] == b"":
            lines.pop()
        yield from lines
        return
    for line in data:
        yield line[:-1] if line.endswith(b"\n") else line


@dataclass(slots=True)
class _Tail:
    """What the signature check needs of the records, watched as they stream past."""

    #: the last record (the signature record of an intact export)
    last: tuple[int, dict[str, Any]] | None = None
    #: the last header or event record
    chained: dict[str, Any] | None = None

    def watch(
        self, records: Iterable[tuple[int, dict[str, Any]]]
    ) -> Iterator[tuple[int, dict[str, Any]]]:
        for found in records:
            self.last = found
            if found[1].get("record") in ("header", "event"):
                self.chained = found[1]
            yield found


def _parse_lines(
    lines: Iterable[bytes], problems: list[AuditProblem]
) -> Iterator[tuple[int, dict[str, Any]]]:
    for index, line in enumerate(lines):
        try:
            value = json.loads(line)
        except (ValueError, UnicodeDecodeError) as exc:
            problems.append(AuditProblem(index, None, "unreadable", f"not JSON ({exc})"))
            continue
        if not isinstance(value, dict):
            problems.append(AuditProblem(index, None, "unreadable", "not a JSON object"))
            continue
        try:
            canonical = canonical_json(value)
        except AuditError as exc:
            problems.append(AuditProblem(index, None, "unreadable", str(exc)))
            continue
        if canonical != line:
            problems.append(
                AuditProblem(
                    index,
                    _seq_of(value),
                    "not-canonical",
                    "the line is not in canonical form (its bytes were edited)",
                )
            )
        yield index, value


def _seq_of(record: Mapping[str, Any]) -> int | None:
    event = record.get("event")
    seq = event.get("seq") if isinstance(event, Mapping) else None
    return seq if isinstance(seq, int) and not isinstance(seq, bool) else None


def _check_chain(
    records: Iterable[tuple[int, dict[str, Any]]], report: AuditReport
) -> Iterator[tuple[int, dict[str, Any]]]:
    """Check the hash chain of ``records`` as they pass (each is yielded on once checked)."""
    problems = report.problems
    records = iter(records)
    head = next(records, None)
    if head is None:
        return
    first_index, first = head
    if first.get("record") != "header" or first_index != 0:
        problems.append(
            AuditProblem(first_index, None, "format", "the first record is not the header")
        )
    elif first.get("format") != AUDIT_FORMAT:
        problems.append(
            AuditProblem(
                0,
                None,
                "format",
                f"format {first.get('format')!r}, this verifier reads {AUDIT_FORMAT!r}",
            )
        )
    session_id = first.get("sessionId")
    report.session_id = session_id if isinstance(session_id, str) else None
    prev = GENESIS
    for line, record in itertools.chain((head,), records):
        if record.get("record") == "signature":
            yield line, record
            continue
        seq = _seq_of(record)
        if record.get("index") != line:
            problems.append(
                AuditProblem(
                    line,
                    seq,
                    "chain",
                    f"the record says it is record {record.get('index')!r} but stands at line "
                    f"{line} (a record was dropped, added or moved)",
                )
            )
        if record.get("prev") != prev:
            problems.append(
                AuditProblem(
                    line,
                    seq,
                    "chain",
                    "prev is not the hash of the record before it (a record before it was dropped, "
                    "added, moved or changed)",
                )
            )
        computed = _record_hash(record)
        if record.get("hash") != computed:
            problems.append(
                AuditProblem(
                    line,
                    seq,
                    "chain",
                    "the record's content does not match its hash (it was changed)",
                )
            )
        # The next record must name the hash this one *claims*: a changed record is named once
        # (here), a dropped or moved one where the chain breaks.
        stored = record.get("hash")
        prev = stored if isinstance(stored, str) else computed
        yield line, record


def _check_signature(
    last_record: tuple[int, dict[str, Any]],
    chained: dict[str, Any] | None,
    report: AuditReport,
    trusted: Ed25519PublicKey | None,
) -> None:
    """``last_record``: the file's last record; ``chained``: its last header or event record."""
    problems = report.problems
    line, last = last_record
    if last.get("record") != "signature":
        problems.append(
            AuditProblem(
                line,
                _seq_of(last),
                "signature",
                "the file does not end with its signature record (it was cut short)",
            )
        )
        return
    final = _record_hash(chained) if chained is not None else GENESIS
    if last.get("finalHash") != final:
        problems.append(
            AuditProblem(
                line, None, "signature", "finalHash is not the hash of the last record before it"
            )
        )
    if last.get("events") != report.events or last.get("sessionId") != report.session_id:
        problems.append(
            AuditProblem(
                line,
                None,
                "signature",
                f"the signature covers {last.get('events')!r} events of session "
                f"{last.get('sessionId')!r}; the file holds {report.events} of "
                f"{report.session_id!r}",
            )
        )
    from cryptography.exceptions import InvalidSignature

    embedded_text = last.get("publicKey")
    try:
        embedded = load_public_key(str(embedded_text), "the embedded public key")
    except AuditError as exc:
        problems.append(AuditProblem(line, None, "signature", str(exc)))
        return
    key = trusted if trusted is not None else embedded
    report.public_key = public_key_text(key)
    if trusted is not None and public_key_text(trusted) != public_key_text(embedded):
        problems.append(
            AuditProblem(
                line,
                None,
                "signature",
                f"signed with key {embedded_text}, not with the trusted --public-key",
            )
        )
    try:
        signature = base64.b64decode(str(last.get("signature")), validate=True)
        key.verify(
            signature,
            _signed_message(last.get("sessionId"), last.get("events"), last.get("finalHash")),
        )
    except (InvalidSignature, ValueError, TypeError):  # also: a signature that is not base64
        problems.append(
            AuditProblem(
                line,
                None,
                "signature",
                f"the Ed25519 signature does not verify with key {report.public_key}",
            )
        )
        return
    report.signed_by_trusted_key = trusted is not None


def _check_seqs(
    events: Iterable[tuple[int, Mapping[str, Any]]], report: AuditReport
) -> Iterator[tuple[int, Mapping[str, Any]]]:
    """Check the events' seqs as they pass (each is yielded on), counting them."""
    problems = report.problems
    expected = 0
    for line, event in events:
        report.events += 1
        seq = event.get("seq")
        if seq != expected:
            problems.append(
                AuditProblem(
                    line,
                    seq if isinstance(seq, int) else None,
                    "seq",
                    f"seq {seq!r} where {expected} was next (an event was dropped, added or moved)",
                )
            )
        expected = (seq if isinstance(seq, int) else expected) + 1
        yield line, event


@dataclass(slots=True)
class _Ask:
    line: int
    seq: int | None
    call_id: str
    digest: Any
    context: dict[str, Any]
    decided: tuple[int, int | None, Mapping[str, Any]] | None = None


_CONTEXT_KEYS: Final = ("sandboxMode", "network", "toolDigest", "compositionDigest")


def _result_call_id(data: Mapping[str, Any]) -> Any:
    message = data.get("message")
    source = message.get("source") if isinstance(message, Mapping) else None
    return source.get("callId") if isinstance(source, Mapping) else None


def _result_is_error(data: Mapping[str, Any]) -> bool:
    message = data.get("message")
    content = message.get("content") if isinstance(message, Mapping) else None
    blocks = [b for b in content or () if isinstance(b, Mapping)]
    return bool(blocks) and all(b.get("isError") is True for b in blocks)


def _check_promises(
    events: Iterable[tuple[int, Mapping[str, Any]]], problems: list[AuditProblem]
) -> None:
    """The log's own promises about calls, results and approvals (see the module docstring)."""
    calls: dict[str, tuple[int, Any]] = {}  # call id -> (line, arguments) of its last tool/call
    asks: dict[str, _Ask] = {}  # ask id -> the ask
    asks_of_call: dict[str, list[_Ask]] = {}
    refused: dict[str, tuple[int, str]] = {}  # call id -> (line, outcome) of a refusal

    def problem(line: int, seq: Any, kind: str, message: str) -> None:
        problems.append(AuditProblem(line, seq if isinstance(seq, int) else None, kind, message))

    for line, event in events:
        kind, seq = event.get("type"), event.get("seq")
        data = event.get("data")
        if not isinstance(data, Mapping):
            continue
        if kind == "tool/call":
            call_id = data.get("callId")
            if not isinstance(call_id, str):
                continue
            for ask in asks_of_call.get(call_id, ()):
                arguments = data.get("arguments")
                if (
                    ask.decided is not None
                    and isinstance(arguments, str)
                    and (args_digest(arguments) != ask.digest)
                ):
                    problem(
                        line,
                        seq,
                        "arguments-changed",
                        f"call {call_id} runs with arguments whose digest is not the "
                        f"argsDigest its approval (record {ask.line}) was decided for",
                    )
            calls[call_id] = (line, data.get("arguments"))
        elif kind == "approval/asked":
            call_id, ask_id = data.get("callId"), data.get("id")
            if not isinstance(call_id, str) or not isinstance(ask_id, str):
                continue  # an ask bound to no call binds no result
            ask = _Ask(
                line,
                seq if isinstance(seq, int) else None,
                call_id,
                data.get("argsDigest"),
                {k: data.get(k) for k in _CONTEXT_KEYS},
            )
            asks[ask_id] = ask
            asks_of_call.setdefault(call_id, []).append(ask)
            recorded = calls.get(call_id)
            if (
                ask.digest is not None
                and recorded is not None
                and isinstance(recorded[1], str)
                and args_digest(recorded[1]) != ask.digest
            ):
                problem(
                    line,
                    seq,
                    "digest-mismatch",
                    f"the ask's argsDigest is not the digest of call {call_id}'s logged "
                    f"arguments (record {recorded[0]})",
                )
        elif kind == "approval/decided":
            ask_id = data.get("id")
            decided_ask = asks.get(ask_id) if isinstance(ask_id, str) else None
            if decided_ask is None:
                problem(
                    line,
                    seq,
                    "decision-without-ask",
                    f"approval/decided for ask {ask_id!r}, which no earlier approval/asked "
                    "made (a decision moved before its ask, or an ask dropped)",
                )
                continue
            ask = decided_ask
            if ask.decided is not None:
                problem(
                    line,
                    seq,
                    "decided-twice",
                    f"ask {ask_id} was already decided at record {ask.decided[0]}",
                )
                continue
            ask.decided = (line, seq if isinstance(seq, int) else None, data)
            if data.get("callId") not in (None, ask.call_id):
                problem(
                    line,
                    seq,
                    "decision-mismatch",
                    f"the decision binds call {data.get('callId')!r}, its ask call {ask.call_id!r}",
                )
            decided_digest = data.get("argsDigest")
            if decided_digest is not None and decided_digest != ask.digest:
                problem(
                    line,
                    seq,
                    "decision-mismatch",
                    f"the decision's argsDigest is not the one asked at record {ask.line}",
                )
            for name in _CONTEXT_KEYS:
                value = data.get(name)
                if (
                    value is not None
                    and ask.context[name] is not None
                    and value != ask.context[name]
                ):
                    problem(
                        line,
                        seq,
                        "decision-mismatch",
                        f"decided under {name} {value!r}, asked under {ask.context[name]!r} "
                        f"(record {ask.line})",
                    )
            decision = data.get("outcome")
            if decision != "allowed-once":
                refused[ask.call_id] = (line, str(decision))
        elif kind == "tool/result":
            result_call = _result_call_id(data)
            if not isinstance(result_call, str):
                continue
            call_id = result_call
            error = data.get("error")
            not_started = isinstance(error, Mapping) and error.get("code") == TOOL_NOT_STARTED
            if call_id not in calls and not (not_started and _result_is_error(data)):
                problem(
                    line,
                    seq,
                    "result-without-call",
                    f"tool/result for call {call_id}, which no earlier tool/call recorded "
                    "as started",
                )
            for ask in asks_of_call.get(call_id, ()):
                if ask.decided is None:
                    problem(
                        line,
                        seq,
                        "undecided-approval",
                        f"tool/result for call {call_id} before its approval (asked at "
                        f"record {ask.line}) was decided",
                    )
            if call_id in refused and not _result_is_error(data):
                at, outcome = refused[call_id]
                problem(
                    line,
                    seq,
                    "ran-after-denial",
                    f"call {call_id} has a successful result after its approval was "
                    f"decided {outcome!r} at record {at}",
                )
