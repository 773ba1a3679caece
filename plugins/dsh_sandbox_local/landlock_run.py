"""Landlock launcher: confine *this* process with Landlock, drop every capability, then exec.

Usage (the CLI contract, versioned with this module)::

    python -I .../landlock_run.py [--ro PATH]... [--rw PATH]... [--deny-tcp] -- ARGV...
    python -I .../landlock_run.py --probe
    python -m dsh_sandbox_local.landlock_run ...      (same thing, when the package is importable)

Why a separate process and not a call inside the harness: a Landlock domain can never be left
again, and it is inherited across ``execve`` and by every descendant. The harness must stay
unrestricted, so the restriction is applied by a short-lived launcher that then *becomes* the
confined command.

Why this module imports only the standard library: it runs as a script (``python -I <file>``),
outside any package context, so that neither ``PYTHONPATH`` nor the working directory can change
which code builds the ruleset.

Order of operations (each step fails closed with exit status 125 and exactly one stderr line that
starts with ``landlock-run: ``):

1. parse the grants; ``--`` is mandatory;
2. ask the kernel for its Landlock ABI (``landlock_create_ruleset(NULL, 0, VERSION)``);
3. build a ruleset handling every filesystem right that ABI knows, TCP bind/connect when
   ``--deny-tcp`` is given (ABI >= 4), and signal + abstract-UNIX-socket scoping (ABI >= 6);
4. add one path-beneath rule per grant (an unopenable grant fails; it never silently narrows);
5. set no_new_privs, empty the capability bounding set (when we may), clear the ambient set, and
   set the effective/permitted/inheritable sets to zero — so a root caller does not carry
   ``CAP_SYS_ADMIN``, ``CAP_DAC_OVERRIDE``, ... into the command, and cannot regain them by exec;
6. ``landlock_restrict_self``; then ``execvp`` the command with the environment unchanged.

After a successful exec, the command's exit status passes through unchanged (125 included), so
an exit status alone never proves a launcher failure: the ``landlock-run: `` line does.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
import sys
from collections.abc import Sequence
from typing import NoReturn

LAUNCHER_FAILURE_EXIT = 125
"""Exit status of every launcher failure (reserved: the command never ran)."""

PREFIX = "landlock-run: "
PARTIAL_NOTICE = "landlock-run: partial enforcement (older Landlock ABI)"
"""Informational line printed before exec on a kernel whose ABI lacks filesystem rights."""

PROBE_FULL = "landlock: fully enforced"
PROBE_PARTIAL = "landlock: partially enforced (older ABI)"

MAX_KNOWN_ABI = 7
"""Highest ABI this launcher knows. A newer kernel is used as if it had this ABI."""

# Syscall numbers: Landlock arrived after the syscall-table unification, so these are the same on
# every architecture Linux supports (x86_64, arm64, riscv64, ...).
SYS_LANDLOCK_CREATE_RULESET = 444
SYS_LANDLOCK_ADD_RULE = 445
SYS_LANDLOCK_RESTRICT_SELF = 446

LANDLOCK_CREATE_RULESET_VERSION = 1 << 0
LANDLOCK_RULE_PATH_BENEATH = 1

# Filesystem access rights (include/uapi/linux/landlock.h).
FS_EXECUTE = 1 << 0
FS_WRITE_FILE = 1 << 1
FS_READ_FILE = 1 << 2
FS_READ_DIR = 1 << 3
FS_REMOVE_DIR = 1 << 4
FS_REMOVE_FILE = 1 << 5
FS_MAKE_CHAR = 1 << 6
FS_MAKE_DIR = 1 << 7
FS_MAKE_REG = 1 << 8
FS_MAKE_SOCK = 1 << 9
FS_MAKE_FIFO = 1 << 10
FS_MAKE_BLOCK = 1 << 11
FS_MAKE_SYM = 1 << 12
FS_REFER = 1 << 13  # ABI 2
FS_TRUNCATE = 1 << 14  # ABI 3
FS_IOCTL_DEV = 1 << 15  # ABI 5

NET_BIND_TCP = 1 << 0  # ABI 4
NET_CONNECT_TCP = 1 << 1  # ABI 4

SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # ABI 6
SCOPE_SIGNAL = 1 << 1  # ABI 6

FS_ABI1 = (1 << 13) - 1
FILE_COMPATIBLE = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV
"""Rights that make sense on a non-directory; a rule on a file with any other bit is EINVAL."""
READ_ONLY = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR

PR_SET_NO_NEW_PRIVS = 38
PR_CAPBSET_DROP = 24
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
CAP_SETPCAP = 8
LINUX_CAPABILITY_VERSION_3 = 0x20080522


class LauncherError(Exception):
    """A failure before exec: becomes one ``landlock-run: `` line and exit status 125."""


class _RulesetAttr(ctypes.Structure):
    _fields_ = (
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    )


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = (("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32))


class _CapHeader(ctypes.Structure):
    _fields_ = (("version", ctypes.c_uint32), ("pid", ctypes.c_int))


class _CapData(ctypes.Structure):
    _fields_ = (
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    )


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _syscall(libc: ctypes.CDLL, number: int, *args: int) -> int:
    """Raw syscall with every argument passed as a full machine word (the call is variadic)."""
    fn = libc.syscall
    fn.restype = ctypes.c_long
    return int(fn(ctypes.c_long(number), *(ctypes.c_long(a) for a in args)))


def _errno_text() -> str:
    return os.strerror(ctypes.get_errno())


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, or 0 when Landlock is absent or disabled.

    Only a query: nothing is restricted. The provider calls this in the harness process.
    """
    if not sys.platform.startswith("linux"):
        return 0
    try:
        libc = _libc()
    except OSError:
        return 0
    abi = _syscall(libc, SYS_LANDLOCK_CREATE_RULESET, 0, 0, LANDLOCK_CREATE_RULESET_VERSION)
    return abi if abi > 0 else 0


def handled_fs_rights(abi: int) -> int:
    """Every filesystem right the given ABI handles (all of them are governed, none ignored)."""
    rights = FS_ABI1
    if abi >= 2:
        rights |= FS_REFER
    if abi >= 3:
        rights |= FS_TRUNCATE
    if abi >= 5:
        rights |= FS_IOCTL_DEV
    return rights


def fs_rights_complete(abi: int) -> bool:
    """Whether the ABI governs every filesystem right this launcher knows (ABI 5 added the last)."""
    return abi >= 5


class Grants:
    """Parsed command line."""

    def __init__(self) -> None:
        self.read_only: list[str] = []
        self.read_write: list[str] = []
        self.deny_tcp = False
        self.probe = False
        self.argv: list[str] = []


def parse_args(args: Sequence[str]) -> Grants:
    """Parse ``[--ro P]... [--rw P]... [--deny-tcp] -- ARGV...`` or a lone ``--probe``."""
    grants = Grants()
    if list(args) == ["--probe"]:
        grants.probe = True
        grants.read_only.append("/")
        return grants
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            grants.argv = list(args[i + 1 :])
            if not grants.argv:
                raise LauncherError("usage error: missing `-- <argv>...` command")
            return grants
        if arg in ("--ro", "--rw"):
            if i + 1 >= len(args) or args[i + 1] == "--":
                raise LauncherError(f"usage error: {arg} requires a path")
            (grants.read_only if arg == "--ro" else grants.read_write).append(args[i + 1])
            i += 2
            continue
        if arg == "--deny-tcp":
            grants.deny_tcp = True
            i += 1
            continue
        raise LauncherError(f"usage error: unknown argument: {arg}")
    raise LauncherError("usage error: missing `-- <argv>...` command")


def _create_ruleset(libc: ctypes.CDLL, abi: int, deny_tcp: bool) -> tuple[int, int]:
    """Create the ruleset; returns (fd, handled filesystem rights)."""
    handled_fs = handled_fs_rights(abi)
    attr = _RulesetAttr(handled_access_fs=handled_fs, handled_access_net=0, scoped=0)
    # The struct grew with the ABI; pass the size this ABI knows so an older kernel does not
    # see trailing fields it would reject with E2BIG.
    size = 8
    if deny_tcp:
        if abi < 4:
            raise LauncherError(
                f"landlock ruleset error: TCP denial needs Landlock ABI 4, this kernel has {abi}"
            )
        attr.handled_access_net = NET_BIND_TCP | NET_CONNECT_TCP
        size = 16
    if abi >= 6:
        attr.scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL
        size = 24
    fd = _syscall(libc, SYS_LANDLOCK_CREATE_RULESET, ctypes.addressof(attr), size, 0)
    if fd < 0:
        raise LauncherError(f"landlock ruleset error: {_errno_text()}")
    return fd, handled_fs


def _add_path_rule(libc: ctypes.CDLL, ruleset_fd: int, path: str, wanted: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError as exc:
        raise LauncherError(f"cannot open rule path: {path}: {exc.strerror}") from None
    try:
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            wanted &= FILE_COMPATIBLE
        attr = _PathBeneathAttr(allowed_access=wanted, parent_fd=fd)
        rc = _syscall(
            libc,
            SYS_LANDLOCK_ADD_RULE,
            ruleset_fd,
            LANDLOCK_RULE_PATH_BENEATH,
            ctypes.addressof(attr),
            0,
        )
        if rc < 0:
            raise LauncherError(f"landlock ruleset error: {path}: {_errno_text()}")
    finally:
        os.close(fd)


def _prctl(libc: ctypes.CDLL, option: int, arg2: int = 0) -> int:
    fn = libc.prctl
    fn.restype = ctypes.c_int
    return int(
        fn(
            ctypes.c_int(option),
            ctypes.c_ulong(arg2),
            ctypes.c_ulong(0),
            ctypes.c_ulong(0),
            ctypes.c_ulong(0),
        )
    )


def _capget(libc: ctypes.CDLL) -> tuple[_CapData, _CapData]:
    header = _CapHeader(version=LINUX_CAPABILITY_VERSION_3, pid=0)
    data = (_CapData * 2)()
    if libc.capget(ctypes.byref(header), data) != 0:
        raise LauncherError(f"cannot read capabilities: {_errno_text()}")
    return data[0], data[1]


def _last_cap() -> int:
    try:
        with open("/proc/sys/kernel/cap_last_cap", encoding="ascii") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return 63


def drop_privileges(libc: ctypes.CDLL) -> None:
    """no_new_privs, then no capability in any set, so exec cannot hand any back.

    With no_new_privs set, the kernel caps whatever an exec would grant (setuid bits, file
    capabilities, root's implicit full set) at the permitted set we hold, which we make empty.
    The bounding set is emptied too when we hold CAP_SETPCAP (root), as defence in depth; a
    caller without CAP_SETPCAP has nothing in its permitted set to lose anyway.
    """
    if _prctl(libc, PR_SET_NO_NEW_PRIVS, 1) != 0:
        raise LauncherError(f"cannot set no_new_privs: {_errno_text()}")
    low, _high = _capget(libc)
    if low.effective & (1 << CAP_SETPCAP):
        for cap in range(_last_cap() + 1):
            if _prctl(libc, PR_CAPBSET_DROP, cap) != 0 and ctypes.get_errno() != errno.EINVAL:
                raise LauncherError(f"cannot drop capability {cap}: {_errno_text()}")
    if _prctl(libc, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL) != 0:
        if ctypes.get_errno() != errno.EINVAL:  # EINVAL: kernel without ambient capabilities
            raise LauncherError(f"cannot clear ambient capabilities: {_errno_text()}")
    header = _CapHeader(version=LINUX_CAPABILITY_VERSION_3, pid=0)
    data = (_CapData * 2)()  # all zero
    if libc.capset(ctypes.byref(header), data) != 0:
        raise LauncherError(f"cannot drop capabilities: {_errno_text()}")
    low, high = _capget(libc)
    held = (
        low.effective
        | low.permitted
        | low.inheritable
        | high.effective
        | high.permitted
        | high.inheritable
    )
    if held:
        raise LauncherError("cannot drop capabilities: some are still held")


def confine_self(grants: Grants) -> int:
    """Apply the whole restriction to this process; returns the ABI used."""
    libc = _libc()
    abi = _syscall(libc, SYS_LANDLOCK_CREATE_RULESET, 0, 0, LANDLOCK_CREATE_RULESET_VERSION)
    if abi < 1:
        raise LauncherError("landlock is not enforced by this kernel (ABI unsupported or disabled)")
    abi = min(abi, MAX_KNOWN_ABI)
    ruleset_fd, handled = _create_ruleset(libc, abi, grants.deny_tcp)
    try:
        for path in grants.read_only:
            _add_path_rule(libc, ruleset_fd, path, READ_ONLY & handled)
        for path in grants.read_write:
            _add_path_rule(libc, ruleset_fd, path, handled)
        drop_privileges(libc)
        if _syscall(libc, SYS_LANDLOCK_RESTRICT_SELF, ruleset_fd, 0) != 0:
            raise LauncherError(f"landlock ruleset error: {_errno_text()}")
    finally:
        os.close(ruleset_fd)
    return abi


def _fail(message: str) -> NoReturn:
    sys.stderr.write(f"{PREFIX}{message}\n")
    sys.stderr.flush()
    os._exit(LAUNCHER_FAILURE_EXIT)


def main(args: Sequence[str]) -> NoReturn:
    """Run the launcher; never returns (exec, or exit 0 after a probe, or exit 125)."""
    try:
        if not sys.platform.startswith("linux"):
            raise LauncherError(
                "landlock is not enforced by this kernel (ABI unsupported or disabled)"
            )
        grants = parse_args(args)
        abi = confine_self(grants)
    except LauncherError as exc:
        _fail(str(exc))
    except MemoryError:
        _fail("out of memory")
    except Exception as exc:  # any other failure before exec must still fail closed
        _fail(f"internal error: {type(exc).__name__}: {exc}")
    if grants.probe:
        sys.stdout.write((PROBE_FULL if fs_rights_complete(abi) else PROBE_PARTIAL) + "\n")
        sys.stdout.flush()
        os._exit(0)
    if not fs_rights_complete(abi):
        sys.stderr.write(PARTIAL_NOTICE + "\n")
        sys.stderr.flush()
    try:
        os.execvp(grants.argv[0], grants.argv)
    except OSError as exc:
        _fail(f"exec failed: {exc.strerror}")


if __name__ == "__main__":
    main(sys.argv[1:])
