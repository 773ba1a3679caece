"""``dsh trust [FILE]``: let ``dsh`` load a project's ``dsh.yml`` while it stays as reviewed.

A composition in the current directory could have been written by a tool (D16), so it
is loaded only when named or trusted. ``dsh trust`` records the file's canonical path and the
SHA-256 of its bytes in ``$XDG_CONFIG_HOME/dsh/trusted.json``; any later change (by anyone)
makes ``dsh`` skip the file again until it is trusted anew. The file is checked first as a
trusted project file would be at boot (plugins resolve, configs validate, no row imports code or
chooses an executable); a file that would be refused is not trusted. ``--revoke`` forgets a
file, ``--list`` prints the records.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from .._compositions import PROJECT_FILE, revoke, trust, trusted_files
from .._loader import resolve_plugin
from .._shipped_plugins import declared_project_files
from .._userdirs import trust_store_file
from .common import CliUsageError
from .output import console

#: Project files a plugin reads only when trusted (its ``project_files``; the plugin's
#: ``check_trusted_file`` checks them here): the Claude Code hook files, which name commands.
PLUGIN_PROJECT_FILES: dict[str, str] = declared_project_files()


def _plugin_reading(path: Path) -> str | None:
    """The plugin that reads ``path`` as a trusted project file, by its last two components."""
    tail = "/".join(Path(os.path.abspath(path)).parts[-2:])
    return PLUGIN_PROJECT_FILES.get(tail)


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        "trust",
        help=f"let dsh load ./{PROJECT_FILE} (or FILE) from its directory while it is unchanged",
        description="Record a project composition's path and SHA-256 so `dsh` loads it from "
        "its directory while its content is unchanged. Review it first: it configures the "
        "tools, the sandbox and the approvals. Rows of a trusted project file may not import "
        "code or choose executables (name the file with --config for that); such a file is "
        "refused here.",
    )
    parser.add_argument("file", nargs="?", default=PROJECT_FILE, metavar="FILE",
                        help=f"the composition to trust (default: ./{PROJECT_FILE})")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--revoke", action="store_true", help="forget FILE instead")
    group.add_argument("--list", action="store_true", help="print every trusted file")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    out = console()
    if args.list:
        files = trusted_files()
        if args.json:
            print(json.dumps({"store": str(trust_store_file()), "files": files}))
            return 0
        if not files:
            out.print("no trusted project files", markup=False)
        for recorded, sha in sorted(files.items()):
            out.print(f"{sha[:16]}  {recorded}", markup=False)
        return 0
    path = Path(args.file)
    if args.revoke:
        if not revoke(path):
            raise CliUsageError(f"{path} is not trusted; `dsh trust --list` shows what is")
        if args.json:
            print(json.dumps({"revoked": str(path)}))
        else:
            out.print(f"no longer trusted: {path}", markup=False)
        return 0
    plugin = _plugin_reading(path)
    if path.name != PROJECT_FILE and plugin is None:
        raise CliUsageError(
            f"{path}: only a directory's {PROJECT_FILE} (or a project hooks file: "
            f"{', '.join(PLUGIN_PROJECT_FILES)}) is loaded by trust; name other "
            "compositions with --config FILE or $DSH_CONFIG"
        )
    if plugin is not None:
        factory, _ = resolve_plugin(plugin, str(path))
        canonical, sha = trust(path, check=factory.check_trusted_file)
    else:
        canonical, sha = trust(path)
    if args.json:
        print(json.dumps({"trusted": str(canonical), "sha256": sha}))
    else:
        out.print(f"trusted {canonical} (sha256 {sha[:16]}…): dsh loads it from its directory "
                  "while its content is unchanged", markup=False)
    return 0
