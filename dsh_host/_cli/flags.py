"""The flags several commands share, defined without importing what the commands run.

``dsh run --help`` builds its parser from these: a command's ``--help`` must not pay for the
loader, the agent or the host.
"""

from __future__ import annotations

import argparse


def add_config_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="YAML composition (default: $DSH_CONFIG, else ./dsh.yml if you trusted it with "
        "`dsh trust`, else ~/.config/dsh/config.yml, else the shipped default)",
    )


def add_root_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--root",
        metavar="DIR",
        help="session store root of the JSONL or SQLite backend (default: the composition's; "
        "in the shipped default $DSH_SESSION_ROOT, else ~/.local/share/dsh/sessions)",
    )
