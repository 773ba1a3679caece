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
   then load the default-deny seccomp filter (the allow-list below);
6. ``landlock_restrict_self``; then ``execvp`` the command with the environment unchanged.

With ``--isolate`` (private mount, PID and IPC namespaces) the launcher re-enters its working
directory by path after its mounts and runs as the namespace's confined PID 1; ``--hide PATH``
covers a harness secret there. Inside bubblewrap (``--no-landlock --init``) it seals the host
device nodes bwrap binds, then runs confined as the call's PID 1 (bwrap ``--as-pid-1``).

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
        self.hide: list[str] = []
        self.init = False
        self.pids_max = 0
        self.memory_max = 0
        self.relay = False
        self.probe = False
        self.argv: list[str] = []


_FLAGS = {"--deny-tcp": "deny_tcp", "--deny-unix": "deny_unix", "--isolate": "isolate",
          "--no-landlock": "no_landlock", "--relay": "relay", "--init": "init"}  # fmt: skip
_NUMBER_OPTIONS = {"--pids-max": "pids_max", "--memory-max": "memory_max"}
_PATH_OPTIONS = {"--ro": "read_only", "--rw": "read_write", "--protect": "protect",
                 "--show": "show", "--hide": "hide"}  # fmt: skip


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
    if (grants.protect or grants.show or grants.hide) and not grants.isolate:
        raise LauncherError(
            "usage error: --protect, --show and --hide need --isolate (a private mount namespace)"
        )
    if grants.init and not grants.no_landlock:
        raise LauncherError("usage error: --init is the bubblewrap stage's; it needs --no-landlock")
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


# -- seccomp: an allow-list of system calls ---------------------------------------------------
#
# Default-deny: a confined process may make only the system calls named in ALLOWED_SYSCALLS (a
# shell, coreutils, git, gcc, Python, Node and pip/npm were measured under this filter with
# ``strace -f -c``; see the plugin README). Everything else fails before the kernel runs it:
#
# * the calls in REFUSED_SYSCALLS fail with EPERM: each one is a known way out of, or around, the
#   sandbox (io_uring runs socket/connect/open behind the filter's back, ptrace and
#   process_vm_* reach other processes, keyrings outlive the call, mount and namespace calls
#   rebuild the view, ...). EPERM is what an unprivileged process gets from most of them anyway,
#   so programs already handle it;
# * every other number (unknown, obsolete, newer than this table) fails with ENOSYS: the answer
#   of a kernel that lacks the call, which is exactly what makes libc and runtimes fall back to
#   an older call that *is* filtered (glibc retries clone3 as clone, whose flags a filter can
#   read; openat2 as openat; statmount as /proc/self/mountinfo). EPERM there would break them.
#
# A few allowed calls have their arguments checked (ARGUMENT_RULES): clone (no CLONE_NEW*
# namespace flags), the chmod family and the creating calls (no set-uid/set-gid bit), socket
# (families AF_INET, AF_INET6, AF_NETLINK, and AF_UNIX unless --deny-unix), socketpair (no
# AF_UNIX datagram pair under --deny-unix), ioctl (no TIOCSTI/TIOCLINUX terminal injection) and
# personality (only the harmless personas). A foreign-architecture or x32 call kills the process.

#: name -> (x86_64 number, number in the generic table shared by aarch64 and riscv64); -1 where
#: that table has no such call. Generated from the kernel's unistd headers (Linux 6.18).
# fmt: off
SYSCALL_NUMBERS: dict[str, tuple[int, int]] = {
    "read": (0, 63), "write": (1, 64), "open": (2, -1), "close": (3, 57), "stat": (4, -1),
    "fstat": (5, 80), "lstat": (6, -1), "poll": (7, -1), "lseek": (8, 62), "mmap": (9, 222),
    "mprotect": (10, 226), "munmap": (11, 215), "brk": (12, 214), "rt_sigaction": (13, 134),
    "rt_sigprocmask": (14, 135), "rt_sigreturn": (15, 139), "ioctl": (16, 29), "pread64": (17, 67),
    "pwrite64": (18, 68), "readv": (19, 65), "writev": (20, 66), "access": (21, -1),
    "pipe": (22, -1), "select": (23, -1), "sched_yield": (24, 124), "mremap": (25, 216),
    "msync": (26, 227), "mincore": (27, 232), "madvise": (28, 233), "shmget": (29, 194),
    "shmat": (30, 196), "shmctl": (31, 195), "dup": (32, 23), "dup2": (33, -1), "pause": (34, -1),
    "nanosleep": (35, 101), "getitimer": (36, 102), "alarm": (37, -1), "setitimer": (38, 103),
    "getpid": (39, 172), "sendfile": (40, 71), "socket": (41, 198), "connect": (42, 203),
    "accept": (43, 202), "sendto": (44, 206), "recvfrom": (45, 207), "sendmsg": (46, 211),
    "recvmsg": (47, 212), "shutdown": (48, 210), "bind": (49, 200), "listen": (50, 201),
    "getsockname": (51, 204), "getpeername": (52, 205), "socketpair": (53, 199),
    "setsockopt": (54, 208), "getsockopt": (55, 209), "clone": (56, 220), "fork": (57, -1),
    "vfork": (58, -1), "execve": (59, 221), "exit": (60, 93), "wait4": (61, 260),
    "kill": (62, 129), "uname": (63, 160), "semget": (64, 190), "semop": (65, 193),
    "semctl": (66, 191), "shmdt": (67, 197), "msgget": (68, 186), "msgsnd": (69, 189),
    "msgrcv": (70, 188), "msgctl": (71, 187), "fcntl": (72, 25), "flock": (73, 32),
    "fsync": (74, 82), "fdatasync": (75, 83), "truncate": (76, 45), "ftruncate": (77, 46),
    "getdents": (78, -1), "getcwd": (79, 17), "chdir": (80, 49), "fchdir": (81, 50),
    "rename": (82, -1), "mkdir": (83, -1), "rmdir": (84, -1), "creat": (85, -1), "link": (86, -1),
    "unlink": (87, -1), "symlink": (88, -1), "readlink": (89, -1), "chmod": (90, -1),
    "fchmod": (91, 52), "chown": (92, -1), "fchown": (93, 55), "lchown": (94, -1),
    "umask": (95, 166), "gettimeofday": (96, 169), "getrlimit": (97, 163), "getrusage": (98, 165),
    "sysinfo": (99, 179), "times": (100, 153), "ptrace": (101, 117), "getuid": (102, 174),
    "syslog": (103, 116), "getgid": (104, 176), "setuid": (105, 146), "setgid": (106, 144),
    "geteuid": (107, 175), "getegid": (108, 177), "setpgid": (109, 154), "getppid": (110, 173),
    "getpgrp": (111, -1), "setsid": (112, 157), "setreuid": (113, 145), "setregid": (114, 143),
    "getgroups": (115, 158), "setgroups": (116, 159), "setresuid": (117, 147),
    "getresuid": (118, 148), "setresgid": (119, 149), "getresgid": (120, 150),
    "getpgid": (121, 155), "setfsuid": (122, 151), "setfsgid": (123, 152), "getsid": (124, 156),
    "capget": (125, 90), "capset": (126, 91), "rt_sigpending": (127, 136),
    "rt_sigtimedwait": (128, 137), "rt_sigqueueinfo": (129, 138), "rt_sigsuspend": (130, 133),
    "sigaltstack": (131, 132), "utime": (132, -1), "mknod": (133, -1), "uselib": (134, -1),
    "personality": (135, 92), "statfs": (137, 43), "fstatfs": (138, 44), "getpriority": (140, 141),
    "setpriority": (141, 140), "sched_setparam": (142, 118), "sched_getparam": (143, 121),
    "sched_setscheduler": (144, 119), "sched_getscheduler": (145, 120),
    "sched_get_priority_max": (146, 125), "sched_get_priority_min": (147, 126),
    "sched_rr_get_interval": (148, 127), "mlock": (149, 228), "munlock": (150, 229),
    "mlockall": (151, 230), "munlockall": (152, 231), "vhangup": (153, 58),
    "modify_ldt": (154, -1), "pivot_root": (155, 41), "prctl": (157, 167), "arch_prctl": (158, -1),
    "adjtimex": (159, 171), "setrlimit": (160, 164), "chroot": (161, 51), "sync": (162, 81),
    "acct": (163, 89), "settimeofday": (164, 170), "mount": (165, 40), "umount2": (166, 39),
    "swapon": (167, 224), "swapoff": (168, 225), "reboot": (169, 142), "sethostname": (170, 161),
    "setdomainname": (171, 162), "iopl": (172, -1), "ioperm": (173, -1), "init_module": (175, 105),
    "delete_module": (176, 106), "quotactl": (179, 60), "gettid": (186, 178),
    "readahead": (187, 213), "setxattr": (188, 5), "lsetxattr": (189, 6), "fsetxattr": (190, 7),
    "getxattr": (191, 8), "lgetxattr": (192, 9), "fgetxattr": (193, 10), "listxattr": (194, 11),
    "llistxattr": (195, 12), "flistxattr": (196, 13), "removexattr": (197, 14),
    "lremovexattr": (198, 15), "fremovexattr": (199, 16), "tkill": (200, 130), "time": (201, -1),
    "futex": (202, 98), "sched_setaffinity": (203, 122), "sched_getaffinity": (204, 123),
    "io_setup": (206, 0), "io_destroy": (207, 1), "io_getevents": (208, 4), "io_submit": (209, 2),
    "io_cancel": (210, 3), "lookup_dcookie": (212, 18), "epoll_create": (213, -1),
    "remap_file_pages": (216, 234), "getdents64": (217, 61), "set_tid_address": (218, 96),
    "restart_syscall": (219, 128), "semtimedop": (220, 192), "fadvise64": (221, 223),
    "timer_create": (222, 107), "timer_settime": (223, 110), "timer_gettime": (224, 108),
    "timer_getoverrun": (225, 109), "timer_delete": (226, 111), "clock_settime": (227, 112),
    "clock_gettime": (228, 113), "clock_getres": (229, 114), "clock_nanosleep": (230, 115),
    "exit_group": (231, 94), "epoll_wait": (232, -1), "epoll_ctl": (233, 21), "tgkill": (234, 131),
    "utimes": (235, -1), "mbind": (237, 235), "set_mempolicy": (238, 237),
    "get_mempolicy": (239, 236), "mq_open": (240, 180), "mq_unlink": (241, 181),
    "mq_timedsend": (242, 182), "mq_timedreceive": (243, 183), "mq_notify": (244, 184),
    "mq_getsetattr": (245, 185), "kexec_load": (246, 104), "waitid": (247, 95),
    "add_key": (248, 217), "request_key": (249, 218), "keyctl": (250, 219),
    "ioprio_set": (251, 30), "ioprio_get": (252, 31), "inotify_init": (253, -1),
    "inotify_add_watch": (254, 27), "inotify_rm_watch": (255, 28), "migrate_pages": (256, 238),
    "openat": (257, 56), "mkdirat": (258, 34), "mknodat": (259, 33), "fchownat": (260, 54),
    "futimesat": (261, -1), "newfstatat": (262, 79), "unlinkat": (263, 35), "renameat": (264, 38),
    "linkat": (265, 37), "symlinkat": (266, 36), "readlinkat": (267, 78), "fchmodat": (268, 53),
    "faccessat": (269, 48), "pselect6": (270, 72), "ppoll": (271, 73), "unshare": (272, 97),
    "set_robust_list": (273, 99), "get_robust_list": (274, 100), "splice": (275, 76),
    "tee": (276, 77), "sync_file_range": (277, 84), "vmsplice": (278, 75),
    "move_pages": (279, 239), "utimensat": (280, 88), "epoll_pwait": (281, 22),
    "signalfd": (282, -1), "timerfd_create": (283, 85), "eventfd": (284, -1),
    "fallocate": (285, 47), "timerfd_settime": (286, 86), "timerfd_gettime": (287, 87),
    "accept4": (288, 242), "signalfd4": (289, 74), "eventfd2": (290, 19),
    "epoll_create1": (291, 20), "dup3": (292, 24), "pipe2": (293, 59), "inotify_init1": (294, 26),
    "preadv": (295, 69), "pwritev": (296, 70), "rt_tgsigqueueinfo": (297, 240),
    "perf_event_open": (298, 241), "recvmmsg": (299, 243), "fanotify_init": (300, 262),
    "fanotify_mark": (301, 263), "prlimit64": (302, 261), "name_to_handle_at": (303, -1),
    "open_by_handle_at": (304, -1), "clock_adjtime": (305, 266), "syncfs": (306, 267),
    "sendmmsg": (307, 269), "setns": (308, 268), "getcpu": (309, 168),
    "process_vm_readv": (310, 270), "process_vm_writev": (311, 271), "kcmp": (312, 272),
    "finit_module": (313, 273), "sched_setattr": (314, 274), "sched_getattr": (315, 275),
    "renameat2": (316, 276), "seccomp": (317, 277), "getrandom": (318, 278),
    "memfd_create": (319, 279), "kexec_file_load": (320, 294), "bpf": (321, 280),
    "execveat": (322, 281), "userfaultfd": (323, 282), "membarrier": (324, 283),
    "mlock2": (325, 284), "copy_file_range": (326, 285), "preadv2": (327, 286),
    "pwritev2": (328, 287), "pkey_mprotect": (329, 288), "pkey_alloc": (330, 289),
    "pkey_free": (331, 290), "statx": (332, 291), "io_pgetevents": (333, 292), "rseq": (334, 293),
    "pidfd_send_signal": (424, 424), "io_uring_setup": (425, 425), "io_uring_enter": (426, 426),
    "io_uring_register": (427, 427), "open_tree": (428, 428), "move_mount": (429, 429),
    "fsopen": (430, 430), "fsconfig": (431, 431), "fsmount": (432, 432), "fspick": (433, 433),
    "pidfd_open": (434, 434), "close_range": (436, 436), "pidfd_getfd": (438, 438),
    "faccessat2": (439, 439), "process_madvise": (440, 440), "epoll_pwait2": (441, 441),
    "mount_setattr": (442, 442), "quotactl_fd": (443, 443), "landlock_create_ruleset": (444, 444),
    "landlock_add_rule": (445, 445), "landlock_restrict_self": (446, 446),
    "process_mrelease": (448, 448), "futex_waitv": (449, 449), "cachestat": (451, 451),
    "fchmodat2": (452, 452), "map_shadow_stack": (453, 453), "futex_wake": (454, 454),
    "futex_wait": (455, 455), "futex_requeue": (456, 456), "mseal": (462, 462),
    "open_tree_attr": (467, 467),
}
# fmt: on

ALLOWED_SYSCALLS = tuple(
    """
read write open close stat fstat lstat poll lseek mmap mprotect munmap brk rt_sigaction
rt_sigprocmask rt_sigreturn ioctl pread64 pwrite64 readv writev access pipe select sched_yield
mremap msync mincore madvise shmget shmat shmctl dup dup2 pause nanosleep getitimer alarm
setitimer getpid sendfile socket connect accept sendto recvfrom sendmsg recvmsg shutdown bind
listen getsockname getpeername socketpair setsockopt getsockopt clone fork vfork execve exit
wait4 kill uname semget semop semctl shmdt msgget msgsnd msgrcv msgctl fcntl flock fsync
fdatasync truncate ftruncate getdents getcwd chdir fchdir rename mkdir rmdir creat link unlink
symlink readlink chmod fchmod chown fchown lchown umask gettimeofday getrlimit getrusage sysinfo
times getuid getgid setuid setgid geteuid getegid setpgid getppid getpgrp setsid setreuid
setregid getgroups setgroups setresuid getresuid setresgid getresgid getpgid setfsuid setfsgid
getsid capget capset rt_sigpending rt_sigtimedwait rt_sigqueueinfo rt_sigsuspend sigaltstack
utime mknod personality statfs fstatfs getpriority setpriority sched_setparam sched_getparam
sched_setscheduler sched_getscheduler sched_get_priority_max sched_get_priority_min
sched_rr_get_interval mlock munlock mlockall munlockall prctl arch_prctl setrlimit sync gettid
readahead setxattr lsetxattr fsetxattr getxattr lgetxattr fgetxattr listxattr llistxattr
flistxattr removexattr lremovexattr fremovexattr tkill time futex sched_setaffinity
sched_getaffinity io_setup io_destroy io_getevents io_submit io_cancel epoll_create
remap_file_pages getdents64 set_tid_address restart_syscall semtimedop fadvise64 timer_create
timer_settime timer_gettime timer_getoverrun timer_delete clock_gettime clock_getres
clock_nanosleep exit_group epoll_wait epoll_ctl tgkill utimes mbind set_mempolicy get_mempolicy
mq_open mq_unlink mq_timedsend mq_timedreceive mq_notify mq_getsetattr waitid ioprio_set
ioprio_get inotify_init inotify_add_watch inotify_rm_watch openat mkdirat mknodat fchownat
futimesat newfstatat unlinkat renameat linkat symlinkat readlinkat fchmodat faccessat pselect6
ppoll set_robust_list get_robust_list splice tee sync_file_range vmsplice utimensat epoll_pwait
signalfd timerfd_create eventfd fallocate timerfd_settime timerfd_gettime accept4 signalfd4
eventfd2 epoll_create1 dup3 pipe2 inotify_init1 preadv pwritev rt_tgsigqueueinfo recvmmsg
prlimit64 syncfs sendmmsg getcpu sched_setattr sched_getattr renameat2 seccomp getrandom
memfd_create execveat membarrier mlock2 copy_file_range preadv2 pwritev2 pkey_mprotect
pkey_alloc pkey_free statx io_pgetevents rseq pidfd_send_signal pidfd_open close_range
faccessat2 epoll_pwait2 landlock_create_ruleset landlock_add_rule landlock_restrict_self
futex_waitv cachestat fchmodat2 map_shadow_stack futex_wake futex_wait futex_requeue mseal
""".split()
)
"""Every system call a confined process may make (some with argument rules, below)."""

REFUSED_SYSCALLS = tuple(
    """
io_uring_setup io_uring_enter io_uring_register ptrace process_vm_readv process_vm_writev
pidfd_getfd keyctl add_key request_key bpf perf_event_open userfaultfd mount umount2 pivot_root
move_mount open_tree open_tree_attr fsopen fsconfig fsmount fspick mount_setattr unshare setns
kexec_load kexec_file_load init_module finit_module delete_module swapon swapoff reboot acct
quotactl quotactl_fd syslog settimeofday clock_settime clock_adjtime adjtimex sethostname
setdomainname iopl ioperm open_by_handle_at name_to_handle_at fanotify_init fanotify_mark
process_madvise process_mrelease kcmp move_pages migrate_pages chroot vhangup lookup_dcookie
modify_ldt uselib
""".split()
)
"""Refused with EPERM whatever the arguments; everything not allowed or refused gets ENOSYS."""

PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_ERRNO = 0x00050000
SECCOMP_RET_KILL_PROCESS = 0x80000000
AF_UNIX = 1
AF_INET = 2
AF_INET6 = 10
AF_NETLINK = 16
SOCK_DGRAM = 2
SOCK_TYPE_MASK = 0xF
SET_ID_BITS = 0o6000  # S_ISUID | S_ISGID
O_CREAT = 0o100  # the same on x86_64, aarch64 and riscv64
O_TMPFILE = 0o20000000  # __O_TMPFILE (with O_DIRECTORY in the O_TMPFILE spelling)
CLONE_NEW_FLAGS = 0x7E020000
"""CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET."""
TIOCSTI = 0x5412
TIOCLINUX = 0x541C
#: personality(2) values allowed: PER_LINUX, PER_LINUX32, UNAME26 variants, and the query.
HARMLESS_PERSONAS = (0x0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF)

#: Per native architecture: (AUDIT_ARCH value, column of SYSCALL_NUMBERS, extra allowed calls).
_SECCOMP_ARCH: dict[str, tuple[int, int, dict[str, int]]] = {
    "x86_64": (0xC000003E, 0, {}),
    "aarch64": (0xC00000B7, 1, {}),
    "riscv64": (0xC00000F3, 1, {"riscv_flush_icache": 259}),  # JITs (Node) need it there
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


_LD_ABS_W, _JEQ_K, _JGT_K, _JGE_K, _JSET_K, _AND_K, _RET_K = (
    0x20, 0x15, 0x25, 0x35, 0x45, 0x54, 0x06)  # fmt: skip
_OFF_NR, _OFF_ARCH = 0, 4
Instruction = tuple[int, int, int, int]
RET_ALLOW = SECCOMP_RET_ALLOW
RET_EPERM = SECCOMP_RET_ERRNO | errno.EPERM
RET_ENOSYS = SECCOMP_RET_ERRNO | errno.ENOSYS
RET_EACCES = SECCOMP_RET_ERRNO | errno.EACCES
RET_EAFNOSUPPORT = SECCOMP_RET_ERRNO | errno.EAFNOSUPPORT


def _arg(index: int) -> int:
    """Offset of the low 32 bits of argument ``index`` in ``struct seccomp_data`` (the rules
    only look at int-sized arguments: modes, flags, families, ioctl commands)."""
    return 16 + 8 * index


def _argument_rules(deny_unix: bool) -> dict[str, list[Instruction]]:
    """name -> a block of instructions that ends in a return on every path.

    Each block loads the argument it judges; blocks are placed right after the test of their
    syscall number, so every jump is short and forward.
    """

    def refuse_bits(index: int, bits: int) -> list[Instruction]:
        return [(_LD_ABS_W, 0, 0, _arg(index)), (_JSET_K, 0, 1, bits),
                (_RET_K, 0, 0, RET_EPERM), (_RET_K, 0, 0, RET_ALLOW)]  # fmt: skip

    def refuse_created_bits(flags: int, mode: int) -> list[Instruction]:
        # open/openat read their mode only with O_CREAT or O_TMPFILE; without them the mode
        # register may hold anything, so it is judged only then.
        return [(_LD_ABS_W, 0, 0, _arg(flags)), (_JSET_K, 1, 0, O_CREAT | O_TMPFILE),
                (_RET_K, 0, 0, RET_ALLOW), *refuse_bits(mode, SET_ID_BITS)]  # fmt: skip

    unix = RET_EACCES if deny_unix else RET_ALLOW
    socket = [
        (_LD_ABS_W, 0, 0, _arg(0)),
        (_JEQ_K, 3, 0, AF_INET),
        (_JEQ_K, 2, 0, AF_INET6),
        (_JEQ_K, 1, 0, AF_NETLINK),
        (_JEQ_K, 1, 2, AF_UNIX),
        (_RET_K, 0, 0, RET_ALLOW),
        (_RET_K, 0, 0, unix),
        (_RET_K, 0, 0, RET_EAFNOSUPPORT),
    ]
    socketpair = [
        (_LD_ABS_W, 0, 0, _arg(0)),
        (_JEQ_K, 1, 0, AF_UNIX),
        (_RET_K, 0, 0, RET_ALLOW),
        (_LD_ABS_W, 0, 0, _arg(1)),
        (_AND_K, 0, 0, SOCK_TYPE_MASK),
        (_JEQ_K, 0, 1, SOCK_DGRAM),
        (_RET_K, 0, 0, RET_EACCES if deny_unix else RET_ALLOW),
        (_RET_K, 0, 0, RET_ALLOW),
    ]
    ioctl = [
        (_LD_ABS_W, 0, 0, _arg(1)),
        (_JEQ_K, 1, 0, TIOCSTI),
        (_JEQ_K, 0, 1, TIOCLINUX),
        (_RET_K, 0, 0, RET_EPERM),
        (_RET_K, 0, 0, RET_ALLOW),
    ]
    personas = len(HARMLESS_PERSONAS)
    personality: list[Instruction] = [(_LD_ABS_W, 0, 0, _arg(0))]
    personality += [(_JEQ_K, personas - i, 0, value) for i, value in enumerate(HARMLESS_PERSONAS)]
    personality += [(_RET_K, 0, 0, RET_EPERM), (_RET_K, 0, 0, RET_ALLOW)]
    return {
        "clone": refuse_bits(0, CLONE_NEW_FLAGS),
        "chmod": refuse_bits(1, SET_ID_BITS),
        "fchmod": refuse_bits(1, SET_ID_BITS),
        "fchmodat": refuse_bits(2, SET_ID_BITS),
        "fchmodat2": refuse_bits(2, SET_ID_BITS),
        "creat": refuse_bits(1, SET_ID_BITS),
        "open": refuse_created_bits(1, 2),
        "openat": refuse_created_bits(2, 3),
        "mknod": refuse_bits(1, SET_ID_BITS),
        "mknodat": refuse_bits(2, SET_ID_BITS),
        "socket": socket,
        "socketpair": socketpair,
        "ioctl": ioctl,
        "personality": personality,
    }


def syscall_verdicts(machine: str) -> tuple[dict[int, int], dict[str, int]]:
    """(number -> return action for the plain allowed and refused calls, name -> number of the
    argument-checked calls) on this architecture. Shared by the filter and its tests."""
    try:
        _audit, column, extra = _SECCOMP_ARCH[machine]
    except KeyError:
        raise LauncherError(f"seccomp error: unsupported architecture {machine}") from None
    checked_names = set(_argument_rules(False))
    verdicts: dict[int, int] = {}
    checked: dict[str, int] = {}
    numbers = {name: pair[column] for name, pair in SYSCALL_NUMBERS.items()} | extra
    for name in (*ALLOWED_SYSCALLS, *extra):
        nr = numbers[name]
        if nr < 0:
            continue
        if name in checked_names:
            checked[name] = nr
        else:
            verdicts[nr] = RET_ALLOW
    for name in REFUSED_SYSCALLS:
        if numbers[name] >= 0:
            verdicts[numbers[name]] = RET_EPERM
    return verdicts, checked


def seccomp_program(machine: str, deny_unix: bool) -> list[Instruction]:
    """The BPF filter as (code, jt, jf, k) instructions: the one builder of the allow-list.

    Layout: the architecture check (anything else is killed), the x32 check (x86_64), one short
    block per argument-checked call, then the plain verdicts as ascending ranges of numbers
    (``nr > hi`` skips to the next range, ``nr >= lo`` returns the range's action, anything in a
    gap returns ENOSYS), then ENOSYS. Plain verdicts look only at the number, so the kernel can
    cache "always allowed" per number and skip the filter for the common calls.
    """
    audit_arch = _SECCOMP_ARCH[machine][0] if machine in _SECCOMP_ARCH else 0
    verdicts, checked = syscall_verdicts(machine)
    out: list[Instruction] = [
        (_LD_ABS_W, 0, 0, _OFF_ARCH),
        (_JEQ_K, 1, 0, audit_arch),
        (_RET_K, 0, 0, SECCOMP_RET_KILL_PROCESS),
        (_LD_ABS_W, 0, 0, _OFF_NR),
    ]
    if machine == "x86_64":
        out += [(_JGE_K, 0, 1, _X32_SYSCALL_BIT), (_RET_K, 0, 0, SECCOMP_RET_KILL_PROCESS)]
    rules = _argument_rules(deny_unix)
    for name, nr in sorted(checked.items(), key=lambda item: item[1]):
        block = rules[name]
        out.append((_JEQ_K, 0, len(block), nr))
        out += block
    ranges: list[list[int]] = []  # [lo, hi, action]
    for nr in sorted(verdicts):
        if ranges and ranges[-1][1] == nr - 1 and ranges[-1][2] == verdicts[nr]:
            ranges[-1][1] = nr
        else:
            ranges.append([nr, nr, verdicts[nr]])
    for lo, hi, action in ranges:
        out += [(_JGT_K, 3, 0, hi), (_JGE_K, 0, 1, lo), (_RET_K, 0, 0, action),
                (_RET_K, 0, 0, RET_ENOSYS)]  # fmt: skip
    out.append((_RET_K, 0, 0, RET_ENOSYS))
    return out


def install_seccomp(libc: ctypes.CDLL, deny_unix: bool) -> None:
    """Load the filter (after no_new_privs); it is inherited by every descendant and can never
    be removed, only narrowed by another filter."""
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
    try:
        cwd = os.getcwd()
    except OSError as exc:
        raise LauncherError(f"cannot isolate: working directory: {exc.strerror}") from None
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
    for path in grants.hide:
        _hide(libc, path)
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
    # The working directory we inherited is the *host's* directory (the mounts above do not move
    # a process that is already inside): /run/postgresql would still hold the host's socket, and
    # a workspace cwd would still be on the read-only mount under the writable bind. Enter it
    # again by path, so the call sees its directory through the private view.
    try:
        os.chdir(cwd)
    except OSError as exc:
        raise LauncherError(
            f"cannot enter the working directory {cwd} inside the sandbox: {exc.strerror}"
        ) from None


#: The host device nodes bubblewrap's ``--dev`` binds into its private /dev (it cannot mknod).
BWRAP_DEVICE_NODES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom",
                      "/dev/tty")  # fmt: skip


def seal_bwrap_devices(libc: ctypes.CDLL) -> None:
    """Make bubblewrap's binds of the host device nodes read-only, keeping them usable.

    The nodes are the host's inodes: without this a call could ``chmod 600 /dev/null`` for the
    whole host. A read-only mount refuses chmod/chown/utime/xattr on them while reads and writes
    of the device still work (bwrap's own ``--remount-ro`` would add ``nodev`` and break them).
    Runs as bubblewrap's PID 1 with only CAP_SYS_ADMIN, before every capability is dropped.
    """
    for path in BWRAP_DEVICE_NODES:
        if os.path.exists(path):
            _mount(libc, None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID)


def _hide(libc: ctypes.CDLL, path: str) -> None:
    """Cover a host path the call must not read (a harness secret): an empty read-only tmpfs
    over a directory, the empty ``/dev/null`` bound read-only over anything else."""
    if os.path.isdir(path):
        _mount(libc, "tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV | MS_RDONLY, "mode=0755")
    elif os.path.lexists(path):
        _mount(libc, "/dev/null", path, None, MS_BIND)
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


def _init(grants: Grants, status_fd: int | None) -> NoReturn:
    """PID 1 of the call's namespace: run the command, reap orphans, exit when it exits.

    When this process exits the kernel kills every other process of the namespace, so nothing
    the command started (``setsid``, ``nohup``, double forks) outlives the call. It runs already
    confined (seccomp, and Landlock unless ``--no-landlock``): no process of the call is
    unfiltered, so the command gains nothing by ptracing or writing into its init. The status
    goes to the relay's pipe (Landlock), or becomes this process's exit status under bubblewrap
    (``--init``, with bwrap's ``--as-pid-1``): 128 + signal for a death by signal, as bwrap's own
    init reports it (PID 1 cannot die by a signal it sends itself).
    """
    command = os.fork()
    if command == 0:
        if status_fd is not None:
            os.close(status_fd)
        for sig in _FORWARDED:
            signal.signal(sig, signal.SIG_DFL)
        _exec(grants.argv)
    for sig in _FORWARDED:
        signal.signal(sig, lambda signum, _frame: _forward(command, signum))
    while True:
        pid, status = os.wait()
        if pid == command:
            if status_fd is None:
                code = os.waitstatus_to_exitcode(status)
                os._exit(code if code >= 0 else 128 - code)
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
        if grants.init:
            seal_bwrap_devices(libc)
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
    if status_fd is not None or grants.init:
        _init(grants, status_fd)
    _exec(grants.argv)


if __name__ == "__main__":
    main(sys.argv[1:])
