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
import signal
import stat
import sys
import time
from collections.abc import Sequence
from typing import NoReturn

LAUNCHER_FAILURE_EXIT = 125
"""Exit status of every launcher failure (reserved: the command never ran)."""

PREFIX = "landlock-run: "
PARTIAL_NOTICE = "landlock-run: partial enforcement (older Landlock ABI)"
"""Informational line printed before exec on a kernel whose ABI lacks filesystem rights."""

PROBE_FULL = "landlock: fully enforced"
PROBE_PARTIAL = "landlock: partially enforced (older ABI)"
PROBE_ISOLATED = "; isolated (mount, PID and IPC namespaces)"

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
        self.deny_unix = False
        self.isolate = False
        self.no_landlock = False
        self.protect: list[str] = []
        self.show: list[str] = []
        self.pids_max = 0
        self.memory_max = 0
        self.relay = False
        self.probe = False
        self.argv: list[str] = []


_FLAGS = {"--deny-tcp": "deny_tcp", "--deny-unix": "deny_unix", "--isolate": "isolate",
          "--no-landlock": "no_landlock", "--relay": "relay"}  # fmt: skip
_NUMBER_OPTIONS = {"--pids-max": "pids_max", "--memory-max": "memory_max"}
_PATH_OPTIONS = {"--ro": "read_only", "--rw": "read_write", "--protect": "protect",
                 "--show": "show"}  # fmt: skip


def parse_args(args: Sequence[str]) -> Grants:
    """Parse ``[--ro P]... [--rw P]... [--protect P]... [--show P]... [--pids-max N]
    [--memory-max BYTES] [--deny-tcp] [--deny-unix] [--isolate | --no-landlock | --relay]
    -- ARGV...``, or ``--probe [--isolate]``."""
    grants = Grants()
    if list(args) in (["--probe"], ["--probe", "--isolate"]):
        grants.probe = True
        grants.isolate = "--isolate" in args
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
        if arg in _PATH_OPTIONS:
            if i + 1 >= len(args) or args[i + 1] == "--":
                raise LauncherError(f"usage error: {arg} requires a path")
            getattr(grants, _PATH_OPTIONS[arg]).append(args[i + 1])
            i += 2
            continue
        if arg in _FLAGS:
            setattr(grants, _FLAGS[arg], True)
            i += 1
            continue
        if arg in _NUMBER_OPTIONS:
            value = args[i + 1] if i + 1 < len(args) else ""
            if not value.isdigit() or int(value) < 1:
                raise LauncherError(f"usage error: {arg} requires a positive integer")
            setattr(grants, _NUMBER_OPTIONS[arg], int(value))
            i += 2
            continue
        raise LauncherError(f"usage error: unknown argument: {arg}")
    raise LauncherError("usage error: missing `-- <argv>...` command")


def _check_combination(grants: Grants) -> None:
    if (grants.protect or grants.show) and not grants.isolate:
        raise LauncherError(
            "usage error: --protect and --show need --isolate (a private mount namespace)"
        )
    if grants.no_landlock and (grants.read_only or grants.read_write or grants.isolate):
        raise LauncherError("usage error: --no-landlock takes no grants and no --isolate")
    if grants.relay and (grants.read_only or grants.read_write or grants.isolate):
        raise LauncherError("usage error: --relay takes no grants and no --isolate")
    if (grants.pids_max or grants.memory_max) and not (grants.isolate or grants.relay):
        raise LauncherError("usage error: --pids-max and --memory-max need --isolate or --relay")


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


# -- seccomp: no AF_UNIX sockets, no keyrings ----------------------------------------------------

PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_ERRNO = 0x00050000
SECCOMP_RET_KILL_PROCESS = 0x80000000
AF_UNIX = 1
SOCK_DGRAM = 2
SOCK_TYPE_MASK = 0xF

#: Per native architecture: (AUDIT_ARCH, socket, socketpair, (add_key, request_key, keyctl)).
#: aarch64 and riscv64 share the generic syscall table.
_SECCOMP_ARCH = {
    "x86_64": (0xC000003E, 41, 53, (248, 249, 250)),
    "aarch64": (0xC00000B7, 198, 199, (217, 218, 219)),
    "riscv64": (0xC00000F3, 198, 199, (217, 218, 219)),
}
_X32_SYSCALL_BIT = 0x40000000


class _SockFilter(ctypes.Structure):
    _fields_ = (
        ("code", ctypes.c_uint16),
        ("jt", ctypes.c_uint8),
        ("jf", ctypes.c_uint8),
        ("k", ctypes.c_uint32),
    )


class _SockFprog(ctypes.Structure):
    _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter)))


_LD_ABS_W, _JEQ_K, _JGE_K, _AND_K, _RET_K = 0x20, 0x15, 0x35, 0x54, 0x06
_OFF_NR, _OFF_ARCH, _OFF_ARG0, _OFF_ARG1 = 0, 4, 16, 24


def seccomp_program(machine: str, deny_unix: bool) -> list[tuple[int, int, int, int]]:
    """The BPF filter as (code, jt, jf, k) instructions.

    Always: the keyring syscalls fail with EPERM (a key stored in the user keyring outlives the
    call and reaches later unconfined processes), and any foreign-architecture or x32 syscall
    kills the process (so a 32-bit binary cannot take the unfiltered path). With
    ``deny_unix``: ``socket(AF_UNIX, ...)`` fails with EACCES (no connect to a host daemon's
    socket, pathname or abstract) and so does ``socketpair(AF_UNIX, SOCK_DGRAM)`` (a datagram
    pair could be re-addressed); stream/seqpacket socketpairs stay usable.
    """
    try:
        audit_arch, nr_socket, nr_socketpair, keyring = _SECCOMP_ARCH[machine]
    except KeyError:
        raise LauncherError(f"seccomp: unsupported architecture {machine}") from None
    prog: list[tuple[object, ...]] = [
        ("ld", _OFF_ARCH),
        ("jeq", audit_arch, None, "kill"),
        ("ld", _OFF_NR),
    ]
    if machine == "x86_64":
        prog.append(("jge", _X32_SYSCALL_BIT, "kill", None))
    prog += [("jeq", nr, "eperm", None) for nr in keyring]
    if deny_unix:
        prog += [("jeq", nr_socket, "socket", None), ("jeq", nr_socketpair, "pair", None)]
    prog += [
        ("ret", SECCOMP_RET_ALLOW),
        ("label", "socket"),
        ("ld", _OFF_ARG0),
        ("jeq", AF_UNIX, "eacces", "allow"),
        ("label", "pair"),
        ("ld", _OFF_ARG0),
        ("jeq", AF_UNIX, None, "allow"),
        ("ld", _OFF_ARG1),
        ("and", SOCK_TYPE_MASK),
        ("jeq", SOCK_DGRAM, "eacces", "allow"),
        ("label", "allow"),
        ("ret", SECCOMP_RET_ALLOW),
        ("label", "eperm"),
        ("ret", SECCOMP_RET_ERRNO | errno.EPERM),
        ("label", "eacces"),
        ("ret", SECCOMP_RET_ERRNO | errno.EACCES),
        ("label", "kill"),
        ("ret", SECCOMP_RET_KILL_PROCESS),
    ]
    labels: dict[object, int] = {}
    for item in prog:
        if item[0] == "label":
            labels[item[1]] = sum(1 for x in prog[: prog.index(item)] if x[0] != "label")
    out: list[tuple[int, int, int, int]] = []
    for item in prog:
        op = item[0]
        if op == "label":
            continue
        pc = len(out)

        def rel(label: object, pc: int = pc) -> int:
            return 0 if label is None else labels[label] - pc - 1

        k = int(item[1])  # type: ignore[call-overload]
        if op == "ld":
            out.append((_LD_ABS_W, 0, 0, k))
        elif op == "and":
            out.append((_AND_K, 0, 0, k))
        elif op == "ret":
            out.append((_RET_K, 0, 0, k))
        else:
            out.append((_JEQ_K if op == "jeq" else _JGE_K, rel(item[2]), rel(item[3]), k))
    return out


def install_seccomp(libc: ctypes.CDLL, deny_unix: bool) -> None:
    """Load the filter (after no_new_privs); it is inherited by every descendant."""
    program = seccomp_program(os.uname().machine, deny_unix)
    filters = (_SockFilter * len(program))(*(_SockFilter(*ins) for ins in program))
    fprog = _SockFprog(len(program), ctypes.cast(filters, ctypes.POINTER(_SockFilter)))
    if _prctl_ptr(libc, PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog)) != 0:
        raise LauncherError(f"seccomp error: {_errno_text()}")


def _prctl_ptr(libc: ctypes.CDLL, option: int, arg2: int, arg3: int) -> int:
    fn = libc.prctl
    fn.restype = ctypes.c_int
    return int(
        fn(ctypes.c_int(option), ctypes.c_ulong(arg2), ctypes.c_ulong(arg3), ctypes.c_ulong(0),
           ctypes.c_ulong(0))
    )  # fmt: skip


# -- isolation: private mount, PID and IPC namespaces (privileged callers) -----------------------

PR_SET_PDEATHSIG = 1
CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18

#: Host paths covered by an empty private tmpfs inside the isolated call: host services' sockets
#: (tmux, PostgreSQL, D-Bus, docker, ...) live there, and so do the host's terminals.
HIDDEN_PATHS = ("/tmp", "/run", "/var/run", "/dev/shm", "/dev/pts")
#: Of which bubblewrap covers /dev/shm and /dev/pts with its own private /dev.
_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


def _mount(libc: ctypes.CDLL, source: str | None, target: str, fstype: str | None, flags: int,
           data: str | None = None) -> None:  # fmt: skip
    def c(value: str | None) -> bytes | None:
        return None if value is None else os.fsencode(value)

    fn = libc.mount
    fn.restype = ctypes.c_int
    rc = fn(c(source), c(target), c(fstype), ctypes.c_ulong(flags), c(data))
    if rc != 0:
        raise LauncherError(f"cannot isolate: mount {target}: {_errno_text()}")


def _die_with_parent(libc: ctypes.CDLL) -> None:
    if _prctl(libc, PR_SET_PDEATHSIG, int(signal.SIGKILL)) != 0:
        raise LauncherError(f"cannot set the parent-death signal: {_errno_text()}")


def join_cgroups(dirs: Sequence[str]) -> None:
    """Move this process (and so every later descendant) into each cgroup directory."""
    for directory in dirs:
        try:
            with open(os.path.join(directory, "cgroup.procs"), "w", encoding="ascii") as f:
                f.write(f"{os.getpid()}\n")
        except OSError as exc:
            raise LauncherError(f"cannot join cgroup: {directory}: {exc.strerror}") from None


# -- per-call cgroups: pids.max and memory limits ------------------------------------------------

#: (controller, limit file) per hierarchy kind; v1 names the memory limit differently.
_LIMIT_FILES = {("pids", 1): "pids.max", ("pids", 2): "pids.max",
                ("memory", 1): "memory.limit_in_bytes", ("memory", 2): "memory.max"}  # fmt: skip


def _own_cgroup_dirs() -> dict[str, tuple[str, int]]:
    """Controller → (this process's cgroup directory, hierarchy version), where writable.

    A v2 controller counts only when this cgroup already delegates it to children
    (``cgroup.subtree_control``); a v1 controller when its hierarchy is mounted.
    """
    try:
        with open("/proc/self/cgroup", encoding="ascii") as f:
            memberships = [line.rstrip("\n").split(":", 2) for line in f]
        with open("/proc/self/mountinfo", encoding="utf-8") as f:
            mounts = [line.split() for line in f]
    except OSError:
        return {}
    found: dict[str, tuple[str, int]] = {}
    for fields in mounts:
        sep = fields.index("-")
        fstype, options = fields[sep + 1], fields[sep + 3].split(",")
        root, point = fields[3], fields[4]
        for _hid, controllers, path in memberships:
            if fstype == "cgroup2" and controllers == "":
                relative = os.path.relpath(path, root) if root != "/" else path.lstrip("/")
                directory = os.path.normpath(os.path.join(point, relative))
                try:
                    with open(os.path.join(directory, "cgroup.subtree_control")) as f:
                        delegated = f.read().split()
                except OSError:
                    continue
                for name in ("pids", "memory"):
                    if name in delegated:
                        found.setdefault(name, (directory, 2))
            elif fstype == "cgroup":
                for name in ("pids", "memory"):
                    if name in options and name in controllers.split(","):
                        relative = path.lstrip("/") if root == "/" else os.path.relpath(path, root)
                        directory = os.path.normpath(os.path.join(point, relative))
                        if os.access(directory, os.W_OK):
                            found[name] = (directory, 1)
    return found


def cgroup_limits_supported() -> tuple[str, ...]:
    """The limit controllers (``pids``, ``memory``) a per-call cgroup can use on this host."""
    return tuple(sorted(_own_cgroup_dirs()))


def make_call_cgroups(pids_max: int, memory_max: int) -> list[tuple[str, str]]:
    """Create this call's cgroups with their limits; [(call dir, parent dir)]."""
    made: list[tuple[str, str]] = []
    wanted = {"pids": pids_max, "memory": memory_max}
    if not pids_max and not memory_max:
        return made
    for name, (parent, version) in sorted(_own_cgroup_dirs().items()):
        if not wanted[name]:
            continue
        _remove_stale(parent)
        directory = os.path.join(parent, f"dsh-call-{os.getpid()}")
        try:
            os.mkdir(directory, 0o755)
            with open(os.path.join(directory, _LIMIT_FILES[(name, version)]), "w") as f:
                f.write(str(wanted[name]))
        except OSError as exc:
            remove_cgroups([*made, (directory, parent)])
            raise LauncherError(f"cannot join cgroup: {directory}: {exc.strerror}") from None
        made.append((directory, parent))
    return made


def _remove_stale(parent: str) -> None:
    """Remove empty call cgroups whose launcher is gone (a harness SIGKILLed mid-call)."""
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        pid = name.removeprefix("dsh-call-")
        if name.startswith("dsh-call-") and pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            try:
                os.rmdir(os.path.join(parent, name))
            except OSError:
                pass  # still has processes, or another launcher got there first


def remove_cgroups(made: Sequence[tuple[str, str]]) -> None:
    """Remove the call's cgroups once empty (bounded retries: teardown is asynchronous)."""
    for directory, _parent in made:
        for _ in range(500):  # up to ~5 s
            try:
                os.rmdir(directory)
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.01)


def _leave_cgroups(made: Sequence[tuple[str, str]]) -> None:
    join_cgroups([parent for _directory, parent in made])


def unshare_namespaces(libc: ctypes.CDLL, flags: int) -> None:
    """New namespaces (``CLONE_NEW*`` flags); a new mount namespace stops propagating to the
    host at once."""
    fn = libc.unshare
    fn.restype = ctypes.c_int
    if fn(ctypes.c_int(flags)) != 0:
        raise LauncherError(f"cannot isolate: unshare: {_errno_text()}")
    if flags & CLONE_NEWNS:
        _mount(libc, None, "/", None, MS_REC | MS_PRIVATE)


def private_mounts(libc: ctypes.CDLL, grants: Grants) -> None:
    """Inside the new namespaces (we are PID 1): own /proc, hidden host paths, read-only binds.

    Granted paths (and ``--show`` paths) that lie under a hidden directory are bound back into
    the private tmpfs from a descriptor opened before it was mounted, so a workspace under
    /tmp keeps working.
    """
    keep: list[tuple[str, int]] = []
    for path in [*grants.read_write, *grants.show]:
        if _under_hidden(path) and os.path.isdir(path):
            keep.append((path, os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)))
    _mount(libc, "proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    for path in HIDDEN_PATHS:
        if os.path.isdir(path) and not os.path.islink(path):
            mode = "1777" if path in ("/tmp", "/dev/shm") else "0755"
            _mount(libc, "tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, f"mode={mode}")
    for path, fd in keep:
        os.makedirs(path, exist_ok=True)
        _mount(libc, f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)  # Landlock governs it
        os.close(fd)
    # Every mount read-only, then the writable grants writable again: metadata changes
    # (chmod, utimes, xattrs), which Landlock does not govern, now fail outside the grants.
    _read_only_everywhere(libc)
    for path in grants.read_write:
        if os.path.isdir(path):
            _mount(libc, path, path, None, MS_BIND | MS_REC)
            _mount(libc, None, path, None, MS_REMOUNT | MS_BIND)
    for path in grants.protect:
        if not os.path.lexists(path):
            continue  # created after the provider looked: nothing to protect yet
        _mount(libc, path, path, None, MS_BIND | MS_REC)
        _mount(libc, None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY)


SYS_MOUNT_SETATTR = 442  # same number on every architecture (after the table unification)
AT_FDCWD = -100
AT_RECURSIVE = 0x8000
MOUNT_ATTR_RDONLY = 0x1


class _MountAttr(ctypes.Structure):
    _fields_ = (
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    )


def _read_only_everywhere(libc: ctypes.CDLL) -> None:
    """``mount_setattr("/", AT_RECURSIVE, RDONLY)`` in our private mount namespace (Linux 5.12)."""
    root = ctypes.create_string_buffer(b"/")
    attr = _MountAttr(attr_set=MOUNT_ATTR_RDONLY)
    rc = _syscall(libc, SYS_MOUNT_SETATTR, AT_FDCWD, ctypes.addressof(root), AT_RECURSIVE,
                  ctypes.addressof(attr), ctypes.sizeof(attr))  # fmt: skip
    if rc != 0:
        raise LauncherError(f"cannot isolate: read-only remount of /: {_errno_text()}")


def _under_hidden(path: str) -> bool:
    """Strictly below a hidden directory (the hidden directory itself stays private)."""
    normalized = os.path.normpath(path)
    return any(normalized.startswith(h + "/") for h in HIDDEN_PATHS)


def _report_status(fd: int, status: int) -> None:
    code = os.waitstatus_to_exitcode(status)
    os.write(fd, f"{code}\n".encode())
    os.close(fd)


def _relay(child: int, status_fd: int, limited: Sequence[tuple[str, str]] = ()) -> NoReturn:
    """The launcher outside the namespaces: forward signals in, then exit as the command did.

    The command's status travels through a pipe (PID 1 of a namespace cannot die by a signal
    it sends itself), so exit codes and deaths by signal pass through unchanged. The relay
    leaves the call's cgroups at once (the child and its descendants stay in them) and removes
    them when the call is over.
    """
    for sig in _FORWARDED:
        signal.signal(sig, lambda signum, _frame: _forward(child, signum))
    _leave_cgroups(limited)
    _pid, status = os.waitpid(child, 0)
    remove_cgroups(limited)
    with os.fdopen(status_fd, "rb") as f:
        report = f.read().strip()
    code = int(report) if report else os.waitstatus_to_exitcode(status)
    if code < 0:
        for sig in _FORWARDED:
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        os._exit(128 - code)
    os._exit(code)


def _forward(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def _init(grants: Grants, status_fd: int) -> NoReturn:
    """PID 1 of the call's namespace: run the command, reap orphans, exit when it exits.

    When this process exits the kernel kills every other process of the namespace, so nothing
    the command started (``setsid``, ``nohup``, double forks) outlives the call.
    """
    command = os.fork()
    if command == 0:
        os.close(status_fd)
        for sig in _FORWARDED:
            signal.signal(sig, signal.SIG_DFL)
        _exec(grants.argv)
    for sig in _FORWARDED:
        signal.signal(sig, lambda signum, _frame: _forward(command, signum))
    while True:
        pid, status = os.wait()
        if pid == command:
            _report_status(status_fd, status)
            os._exit(0)


def _exec(argv: list[str]) -> NoReturn:
    try:
        os.execvp(argv[0], argv)
    except OSError as exc:
        _fail(f"exec failed: {exc.strerror}")


def confine_self(grants: Grants) -> int:
    """Apply the whole restriction to this process; returns the ABI used (0: --no-landlock)."""
    libc = _libc()
    if grants.no_landlock:
        drop_privileges(libc)
        install_seccomp(libc, grants.deny_unix)
        return 0
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
        install_seccomp(libc, grants.deny_unix)
        if _syscall(libc, SYS_LANDLOCK_RESTRICT_SELF, ruleset_fd, 0) != 0:
            raise LauncherError(f"landlock ruleset error: {_errno_text()}")
    finally:
        os.close(ruleset_fd)
    return abi


def prepare(grants: Grants) -> int | None:
    """Everything before the ruleset: the parent-death signal, per-call cgroups, namespaces.

    Returns the status pipe's write end in the namespace's PID 1 (``--isolate``), else None.
    The relay half (outside the namespaces) never returns from here.
    """
    libc = _libc()
    if grants.no_landlock:
        return None
    # Tied to the harness thread that spawned us (the harness spawns from one long-lived
    # thread): when the harness dies, so do we, and with us the whole namespace.
    _die_with_parent(libc)
    limited = make_call_cgroups(grants.pids_max, grants.memory_max)
    join_cgroups([directory for directory, _parent in limited])
    if grants.relay:  # only the limits: fork the runner (bubblewrap) and relay its status
        read_fd, write_fd = os.pipe()
        child = os.fork()
        if child == 0:
            os.close(read_fd)
            os.close(write_fd)
            _exec(grants.argv)
        os.close(write_fd)
        _relay(child, read_fd, limited)
    if not grants.isolate:
        return None
    # PID and IPC namespaces for the child; the relay stays in the host's mount namespace (it
    # must still reach the cgroup tree after the child made its own mounts read-only).
    unshare_namespaces(libc, CLONE_NEWPID | CLONE_NEWIPC)
    read_fd, write_fd = os.pipe()
    child = os.fork()
    if child != 0:
        os.close(write_fd)
        _relay(child, read_fd, limited)
    os.close(read_fd)
    _die_with_parent(libc)  # the relay died (SIGKILL of the call's group): the namespace dies
    unshare_namespaces(libc, CLONE_NEWNS)
    private_mounts(libc, grants)
    return write_fd


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
        _check_combination(grants)
        status_fd = prepare(grants)
        abi = confine_self(grants)
    except LauncherError as exc:
        _fail(str(exc))
    except MemoryError:
        _fail("out of memory")
    except Exception as exc:  # any other failure before exec must still fail closed
        _fail(f"internal error: {type(exc).__name__}: {exc}")
    if grants.probe:
        line = PROBE_FULL if fs_rights_complete(abi) else PROBE_PARTIAL
        if grants.isolate:
            line += PROBE_ISOLATED
        sys.stdout.write(line + "\n")
        sys.stdout.flush()
        if status_fd is not None:
            _report_status(status_fd, 0)
        os._exit(0)
    if not grants.no_landlock and not fs_rights_complete(abi):
        sys.stderr.write(PARTIAL_NOTICE + "\n")
        sys.stderr.flush()
    if status_fd is not None:
        _init(grants, status_fd)
    _exec(grants.argv)


if __name__ == "__main__":
    main(sys.argv[1:])
