"""The escape attempts, as data: what to try, how to see it on the host, what to expect.

Each :class:`Attempt` prepares host state, gives the shell script to run *inside* the sandbox,
and decides from the **host** view afterwards whether the effect happened (file created, content,
mode or mtime changed, process killed, connection accepted, datagram received) — never from the
exit status alone. ``expect`` maps (backend, mode) to one outcome:

* ``DENIED``  — the effect did not happen and the command failed;
* ``ALLOWED`` — the effect happened (intended, or a documented non-guarantee);
* ``PRIVATE`` — the command succeeded but only in a private view; the host is unchanged;
* ``CONTAINED`` — the command succeeded, but what it started did not outlive the call;
* ``gap(text)`` — the effect happened *and* the backend says so: ``enforcement == "partial"``
  with ``text`` in ``not_covered``.

The expectations are DSH's behaviour tightened by decision D9 (root-proof bubblewrap, Landlock
with capabilities dropped, ABI 6 scoping, ``network: deny``).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .sandbox_harness import Scene, sleepers

DENIED = "denied"
ALLOWED = "allowed"
PRIVATE = "private"
CONTAINED = "contained"


def gap(text: str) -> str:
    return f"gap:{text}"


def every(outcome: str) -> dict[tuple[str, str], str]:
    return {(b, m): outcome for b in ("bubblewrap", "landlock")
            for m in ("read-only", "workspace-write")}  # fmt: skip


def by_mode(ro: str, ww: str) -> dict[tuple[str, str], str]:
    return {
        ("bubblewrap", "read-only"): ro,
        ("bubblewrap", "workspace-write"): ww,
        ("landlock", "read-only"): ro,
        ("landlock", "workspace-write"): ww,
    }


def cells(b_ro: str, b_ww: str, l_ro: str, l_ww: str) -> dict[tuple[str, str], str]:
    return {
        ("bubblewrap", "read-only"): b_ro,
        ("bubblewrap", "workspace-write"): b_ww,
        ("landlock", "read-only"): l_ro,
        ("landlock", "workspace-write"): l_ww,
    }


METADATA = "file metadata"
UDP = "UDP"
OLD_TIME = 946_684_800  # 2000-01-01, so a touch is always visible


def q(path: Path | str) -> str:
    return shlex.quote(str(path))


#: The interpreter scripts run inside the sandbox: the real binary behind the (venv) harness
#: interpreter. A venv under /tmp is invisible in bubblewrap's workspace-write mode (its /tmp is
#: private), and ``-I`` scripts need only the standard library.
SANDBOX_PYTHON = os.path.realpath(sys.executable)


def py(code: str) -> str:
    """A Python one-liner run inside the sandbox (stdlib only)."""
    return f"{q(SANDBOX_PYTHON)} -I -c {q(code)}"


@dataclass(frozen=True)
class Snapshot:
    content: bytes
    mode: int
    mtime_ns: int
    ino: int
    nlink: int
    uid: int
    gid: int
    xattrs: tuple[str, ...]

    @classmethod
    def of(cls, path: Path) -> Snapshot:
        st = os.lstat(path)
        return cls(
            content=path.read_bytes(),
            mode=st.st_mode,
            mtime_ns=st.st_mtime_ns,
            ino=st.st_ino,
            nlink=st.st_nlink,
            uid=st.st_uid,
            gid=st.st_gid,
            xattrs=tuple(sorted(os.listxattr(path))),
        )


def make_victim(path: Path, content: bytes = b"original\n") -> Snapshot:
    path.write_bytes(content)
    os.chmod(path, 0o644)
    os.utime(path, (OLD_TIME, OLD_TIME))
    return Snapshot.of(path)


def changed(path: Path, before: Snapshot) -> bool:
    try:
        return Snapshot.of(path) != before
    except FileNotFoundError:
        return True


@dataclass
class Attempt:
    """One row of the table. Subclasses override :meth:`prepare`/:meth:`happened`/:meth:`close`."""

    id: str
    spec: str
    title: str
    expect: dict[tuple[str, str], str]
    network: str = "deny"
    unix_sockets: str = "deny"
    denial_dialect: bool = False
    """The blocked file write must print this backend's denial signature."""
    note: str = ""
    state: dict[str, Any] = field(default_factory=dict)

    def prepare(self, s: Scene) -> None:
        """Host-side set-up before the sandboxed run."""

    def script(self, s: Scene) -> str:
        raise NotImplementedError

    def happened(self, s: Scene, result: subprocess.CompletedProcess[str]) -> bool:
        raise NotImplementedError

    def close(self, s: Scene) -> None:
        """Undo host-side resources (and repair the host if an escape did succeed)."""


class CreateFile(Attempt):
    """Create ``target`` (a function of the scene) from inside; happened = it exists on the host."""

    def __init__(self, id: str, spec: str, title: str, expect: dict[tuple[str, str], str],
                 target: Any, *, via: Any = None, **kw: Any) -> None:  # fmt: skip
        super().__init__(id, spec, title, expect, **kw)
        self.target = target
        self.via = via or target

    def script(self, s: Scene) -> str:
        return f"echo escaped > {q(self.via(s))}"

    def happened(self, s: Scene, result: subprocess.CompletedProcess[str]) -> bool:
        return os.path.lexists(self.target(s))

    def close(self, s: Scene) -> None:
        target = Path(self.target(s))
        if target.is_file() and not str(target).startswith(str(s.base)):
            target.unlink()


class ModifyVictim(Attempt):
    """Run ``command`` against an outside victim file; happened = any field of its stat changed."""

    def __init__(self, id: str, spec: str, title: str, expect: dict[tuple[str, str], str],
                 command: str, **kw: Any) -> None:  # fmt: skip
        super().__init__(id, spec, title, expect, **kw)
        self.command = command

    def prepare(self, s: Scene) -> None:
        self.state["before"] = make_victim(s.out / "victim.txt")
        (s.ws / "existing.txt").write_text("workspace file\n")
        os.symlink(s.out / "victim.txt", s.ws / "link_file")
        os.symlink(s.out, s.ws / "link_dir")

    def script(self, s: Scene) -> str:
        return self.command.format(
            victim=q(s.out / "victim.txt"), out=q(s.out), ws=q(s.ws), base=q(s.base),
            py=q(SANDBOX_PYTHON), pid=os.getpid(),
        )  # fmt: skip

    def happened(self, s: Scene, result: subprocess.CompletedProcess[str]) -> bool:
        return changed(s.out / "victim.txt", self.state["before"])


class Custom(Attempt):
    """An attempt with its own set-up and host check (passed as functions)."""

    def __init__(self, id: str, spec: str, title: str, expect: dict[tuple[str, str], str],
                 script: Any, happened: Any, prepare: Any = None, close: Any = None,
                 **kw: Any) -> None:  # fmt: skip
        super().__init__(id, spec, title, expect, **kw)
        self._script, self._happened, self._prepare, self._close = script, happened, prepare, close

    def prepare(self, s: Scene) -> None:
        if self._prepare:
            self._prepare(self, s)

    def script(self, s: Scene) -> str:
        return str(self._script(self, s))

    def happened(self, s: Scene, result: subprocess.CompletedProcess[str]) -> bool:
        return bool(self._happened(self, s, result))

    def close(self, s: Scene) -> None:
        if self._close:
            self._close(self, s)


# -- host resources -------------------------------------------------------------------------------


def _start_victim(a: Attempt, s: Scene) -> None:
    """A host process of the same uid, with its cwd outside and an outside file open read-write.

    It echoes lines, so it is alive iff it answers a ping; its ``/proc/<pid>/cwd`` and
    ``/proc/<pid>/fd/<n>`` are the magic links an escape would try to follow.
    """
    held = s.out / "held.txt"
    a.state["held"] = make_victim(held)
    proc = subprocess.Popen(
        [sys.executable, "-I", "-c",
         "import os, sys\nfd = os.open(sys.argv[1], os.O_RDWR)\nprint(fd, flush=True)\n"
         "for line in sys.stdin:\n    sys.stdout.write(line); sys.stdout.flush()", str(held)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=s.out,
    )  # fmt: skip
    assert proc.stdin is not None and proc.stdout is not None
    a.state["fd"] = int(proc.stdout.readline())
    proc.stdin.write("ready\n")
    proc.stdin.flush()
    assert proc.stdout.readline() == "ready\n"
    a.state["victim"] = proc


def _magic_link_script(a: Attempt, s: Scene) -> str:
    """Try both links; exit 0 if either write went through."""
    pid, fd = a.state["victim"].pid, a.state["fd"]
    return (
        f"echo escaped > /proc/{pid}/cwd/via_cwd.txt; r1=$?; "
        f"echo escaped > /proc/{pid}/fd/{fd}; r2=$?; [ $r1 -eq 0 ] || [ $r2 -eq 0 ]"
    )


def _magic_link_written(a: Attempt, s: Scene, result: Any) -> bool:
    return (s.out / "via_cwd.txt").exists() or changed(s.out / "held.txt", a.state["held"])


def _victim_killed(a: Attempt, s: Scene, result: Any) -> bool:
    # Deterministic: a SIGKILL that was delivered before the sandboxed command exited is acted on
    # before the victim can run again, so it can never answer this ping.
    proc: subprocess.Popen[str] = a.state["victim"]
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdin.write("ping\n")
        proc.stdin.flush()
    except BrokenPipeError:
        return True
    return proc.stdout.readline() != "ping\n"


def _stop_victim(a: Attempt, s: Scene) -> None:
    proc: subprocess.Popen[str] = a.state["victim"]
    proc.kill()
    proc.wait()
    for stream in (proc.stdin, proc.stdout):
        if stream is not None:
            with contextlib.suppress(BrokenPipeError):  # the escape (or we) killed it
                stream.close()


def _tcp_listener(a: Attempt, s: Scene) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    a.state["sock"] = sock
    a.state["addr"] = sock.getsockname()


def _unix_listener(abstract: bool) -> Any:
    def prepare(a: Attempt, s: Scene) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        name = f"\0dsh-sbx-{s.token}" if abstract else str(s.out / "host.sock")
        sock.bind(name)
        sock.listen(8)
        a.state["sock"] = sock
        a.state["addr"] = name

    return prepare


def _accepted(a: Attempt, s: Scene, result: Any) -> bool:
    # A completed connect() is in the accept queue before connect() returns inside the sandbox.
    sock: socket.socket = a.state["sock"]
    sock.setblocking(False)
    try:
        conn, _ = sock.accept()
    except BlockingIOError:
        return False
    conn.close()
    return True


def _close_sock(a: Attempt, s: Scene) -> None:
    a.state["sock"].close()


def _udp_receiver(a: Attempt, s: Scene) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    a.state["sock"] = sock
    a.state["addr"] = sock.getsockname()


def _udp_received(a: Attempt, s: Scene, result: Any) -> bool:
    # Send a sentinel from the host after the sandbox exited, then read up to it: anything the
    # sandbox got through was queued before the sentinel.
    sock: socket.socket = a.state["sock"]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
        sender.sendto(b"sentinel", a.state["addr"])
    sock.settimeout(30)  # hang protection; the sentinel is already queued
    seen = []
    while True:
        data = sock.recv(65536)
        if data == b"sentinel":
            break
        seen.append(data)
    return b"escaped" in seen


def _connect_script(family: str) -> Any:
    def script(a: Attempt, s: Scene) -> str:
        addr = a.state["addr"]
        if family == "tcp":
            code = (f"import socket; s = socket.socket(); s.settimeout(20); "
                    f"s.connect(('127.0.0.1', {addr[1]})); print('connected')")  # fmt: skip
        else:
            code = (f"import socket; s = socket.socket(socket.AF_UNIX); s.settimeout(20); "
                    f"s.connect({addr!r}); print('connected')")  # fmt: skip
        return py(code)

    return script


def _udp_script(a: Attempt, s: Scene) -> str:
    port = a.state["addr"][1]
    return py(
        "import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
        f"n = s.sendto(b'escaped', ('127.0.0.1', {port})); print('sent', n)"
    )


def _read_domainname(a: Attempt, s: Scene) -> None:
    a.state["domainname"] = Path("/proc/sys/kernel/domainname").read_text()


def _domainname_changed(a: Attempt, s: Scene, result: Any) -> bool:
    return bool(Path("/proc/sys/kernel/domainname").read_text() != a.state["domainname"])


def _restore_domainname(a: Attempt, s: Scene) -> None:
    path = Path("/proc/sys/kernel/domainname")
    if path.read_text() != a.state["domainname"]:
        path.write_text(a.state["domainname"])


def _host_tmp(prefix: str) -> Any:
    return lambda s: Path(prefix) / f"dsh-sbx-{s.token}"


def _plant_alias(a: Attempt, s: Scene) -> None:
    a.state["before"] = make_victim(s.out / "aliased.txt")
    os.link(s.out / "aliased.txt", s.ws / "alias")
    a.state["before"] = Snapshot.of(s.out / "aliased.txt")


def _caps_script(a: Attempt, s: Scene) -> str:
    # Exit 0 (the "attempt succeeded") only if some capability set is non-empty.
    return py(
        "import re, sys; t = open('/proc/self/status').read(); print(t); "
        "sys.exit(0 if any(int(v, 16) for v in "
        "re.findall(r'^Cap(?:Eff|Prm|Amb|Inh):\\s+([0-9a-f]+)$', t, re.M)) else 1)"
    )


def _caps_held(a: Attempt, s: Scene, result: Any) -> bool:
    values = [
        line.split()[1]
        for line in result.stdout.splitlines()
        if line.split(":")[0] in ("CapEff", "CapPrm", "CapAmb", "CapInh")
    ]
    assert len(values) == 4, result.stdout + result.stderr
    return any(int(v, 16) for v in values)


def _remount(s: Scene, name: str) -> str:
    out = q(s.out)
    return (f"mount --bind {out} {out} && mount -o remount,bind,rw {out} && "
            f"echo escaped > {q(s.out / name)}")  # fmt: skip


def _secret(a: Attempt, s: Scene) -> None:
    (s.out / "secret.txt").write_text(f"secret-{s.token}\n")
    os.chmod(s.out / "secret.txt", 0o600)


CATALOG: list[Attempt] = [
    CreateFile(
        "ws-create",
        "#1",
        "create a file in the workspace",
        by_mode(DENIED, ALLOWED),
        lambda s: s.ws / "new.txt",
        denial_dialect=True,
    ),
    Custom(
        "ws-mkdir",
        "#3",
        "mkdir + write under the workspace",
        by_mode(DENIED, ALLOWED),
        script=lambda a, s: f"mkdir {q(s.ws / 'd')} && echo x > {q(s.ws / 'd' / 'f')}",
        happened=lambda a, s, r: (s.ws / "d" / "f").exists(),
    ),
    CreateFile(
        "outside-create",
        "#2",
        "create a file outside the workspace",
        every(DENIED),
        lambda s: s.out / "new.txt",
        denial_dialect=True,
    ),
    ModifyVictim(
        "outside-overwrite",
        "#2",
        "overwrite an outside file",
        every(DENIED),
        "echo escaped > {victim}",
        denial_dialect=True,
    ),
    ModifyVictim(
        "outside-delete",
        "#2",
        "delete an outside file",
        every(DENIED),
        "rm -f {victim}",
        denial_dialect=True,
    ),
    CreateFile(
        "tmp-write",
        "#4",
        "write /tmp/<name>",
        cells(DENIED, PRIVATE, DENIED, PRIVATE),
        _host_tmp("/tmp"),
        note="private tmpfs (Landlock: the launcher's mount namespace, root)",
    ),
    CreateFile(
        "var-tmp-write", "#5", "write /var/tmp/<name>", every(DENIED), _host_tmp("/var/tmp")
    ),
    Custom(
        "dev-null",
        "#6",
        "write /dev/null",
        every(ALLOWED),
        script=lambda a, s: "echo x > /dev/null",
        happened=lambda a, s, r: r.returncode == 0,
    ),
    CreateFile(
        "dev-shm",
        "#7",
        "write /dev/shm/<name>",
        cells(PRIVATE, PRIVATE, DENIED, PRIVATE),
        _host_tmp("/dev/shm"),
        note="bwrap: private /dev tmpfs; Landlock WW: the namespace's private tmpfs, granted",
    ),
    ModifyVictim(
        "symlink-file",
        "#8",
        "write through a workspace symlink to an outside file",
        every(DENIED),
        "echo escaped > {ws}/link_file",
        denial_dialect=True,
    ),
    Custom(
        "symlink-dir",
        "#9",
        "create through a workspace symlink to an outside dir",
        every(DENIED),
        prepare=lambda a, s: os.symlink(s.out, s.ws / "link_dir"),
        script=lambda a, s: f"echo escaped > {q(s.ws / 'link_dir' / 'via_link.txt')}",
        happened=lambda a, s, r: (s.out / "via_link.txt").exists(),
        denial_dialect=True,
    ),
    ModifyVictim(
        "symlink-planted",
        "#8",
        "plant a symlink in the sandbox, write through it",
        every(DENIED),
        "ln -s {victim} {ws}/planted && echo escaped > {ws}/planted",
    ),
    ModifyVictim(
        "hardlink-into-ws",
        "#10",
        "hard-link an outside file into the workspace",
        every(DENIED),
        "ln {victim} {ws}/hardlink",
        note="bwrap WW: EXDEV (other mount); Landlock: REFER rule",
    ),
    Custom(
        "hardlink-preexisting",
        "#11",
        "write via a pre-existing hard link to outside",
        by_mode(DENIED, ALLOWED),
        prepare=_plant_alias,
        script=lambda a, s: f"echo escaped > {q(s.ws / 'alias')}",
        happened=lambda a, s, r: changed(s.out / "aliased.txt", a.state["before"]),
        note="inherent: a hard link inside the workspace is a workspace file",
    ),
    Custom(
        "rename-out",
        "#12",
        "move a workspace file to an outside path",
        every(DENIED),
        prepare=lambda a, s: (s.ws / "existing.txt").write_text("ws\n"),
        script=lambda a, s: f"mv {q(s.ws / 'existing.txt')} {q(s.out / 'moved.txt')}",
        happened=lambda a, s, r: (
            (s.out / "moved.txt").exists() or not (s.ws / "existing.txt").exists()
        ),
    ),
    ModifyVictim(
        "rename-in",
        "#12",
        "move an outside file into the workspace",
        every(DENIED),
        "mv {victim} {ws}/stolen.txt",
        note="mv's copy fallback may copy (a read); the outside file stays",
    ),
    Custom(
        "rename-ws-root",
        "#12",
        "rename the workspace root itself",
        every(DENIED),
        script=lambda a, s: f"mv {q(s.ws)} {q(s.base / 'ws-moved')}",
        happened=lambda a, s, r: not s.ws.is_dir() or (s.base / "ws-moved").exists(),
    ),
    ModifyVictim(
        "truncate",
        "#13",
        "truncate -s0 an outside file",
        every(DENIED),
        "truncate -s0 {victim}",
        denial_dialect=True,
    ),
    ModifyVictim(
        "chmod",
        "#14",
        "chmod an outside file",
        every(DENIED),
        "chmod 0600 {victim}",
        note="Landlock: read-only mount namespace (root); unprivileged: a reported gap",
    ),
    ModifyVictim(
        "chown",
        "#14",
        "chown an outside file",
        every(DENIED),
        "chown 4242:4242 {victim}",
        note="Landlock: no CAP_CHOWN after the launcher dropped capabilities",
    ),
    ModifyVictim(
        "touch",
        "#15",
        "touch -d (utimes) an outside file",
        every(DENIED),
        "touch -d '2001-02-03 04:05:06' {victim}",
    ),
    ModifyVictim(
        "xattr",
        "#15",
        "set a user xattr on an outside file",
        every(DENIED),
        '{py} -I -c \'import os, sys; os.setxattr(sys.argv[1], "user.dsh", b"x")\' {victim}',
    ),
    CreateFile(
        "proc-self-root",
        "#16",
        "write via /proc/self/root/<outside>",
        every(DENIED),
        lambda s: s.out / "via_proc_self.txt",
        via=lambda s: f"/proc/self/root{s.out}/via_proc_self.txt",
        denial_dialect=True,
    ),
    CreateFile(
        "proc-1-root",
        "#17",
        "write via /proc/1/root/<outside>",
        every(DENIED),
        lambda s: s.out / "via_proc_1.txt",
        via=lambda s: f"/proc/1/root{s.out}/via_proc_1.txt",
        note="bwrap: PID 1 is the sandbox's init; Landlock: ptrace scope",
    ),
    CreateFile(
        "proc-host-pid-root",
        "#17",
        "write via /proc/<harness pid>/root/<outside>",
        every(DENIED),
        lambda s: s.out / "via_proc_pid.txt",
        via=lambda s: f"/proc/{os.getpid()}/root{s.out}/via_proc_pid.txt",
    ),
    Custom(
        "proc-host-pid-cwd-fd",
        "#17",
        "write via a host process's /proc/<pid>/cwd and /proc/<pid>/fd/<n>",
        every(DENIED),
        prepare=_start_victim,
        close=_stop_victim,
        script=_magic_link_script,
        happened=_magic_link_written,
        note="the host process has its cwd outside and an outside file open read-write",
    ),
    Custom(
        "kill-host-process",
        "#18",
        "SIGKILL a host process of the same uid",
        every(DENIED),
        prepare=_start_victim,
        close=_stop_victim,
        happened=_victim_killed,
        script=lambda a, s: f"kill -{int(signal.SIGKILL)} {a.state['victim'].pid}",
        note="bwrap: invisible (PID ns); Landlock: ABI 6 signal scoping",
    ),
    Custom(
        "mount-remount",
        "#19",
        "mount --bind + remount,rw, then write (as root)",
        every(DENIED),
        script=lambda a, s: _remount(s, "via_mount.txt"),
        happened=lambda a, s, r: (s.out / "via_mount.txt").exists(),
        note="bwrap: --cap-drop ALL (D9); Landlock: mount refused in a domain",
    ),
    Custom(
        "unshare-remount",
        "#20",
        "unshare -Urm, remount rw, then write",
        every(DENIED),
        script=lambda a, s: f"unshare -Urm bash -c {q(_remount(s, 'via_unshare.txt'))}",
        happened=lambda a, s, r: (s.out / "via_unshare.txt").exists(),
        note="inherited mounts stay locked read-only in a nested user namespace",
    ),
    Custom(
        "proc-sys-write",
        "#21",
        "write a host sysctl (kernel.domainname)",
        every(DENIED),
        prepare=_read_domainname,
        close=_restore_domainname,
        happened=_domainname_changed,
        script=lambda a, s: f"echo dsh-escape-{s.token[-6:]} > /proc/sys/kernel/domainname",
        note="bwrap: --ro-bind /proc/sys (D9; bwrap skips it for root); Landlock: not granted",
    ),
    Custom(
        "capabilities",
        "#29",
        "hold any capability inside (root caller)",
        every(DENIED),
        script=_caps_script,
        happened=_caps_held,
        note="CapEff/CapPrm/CapInh/CapAmb all zero (D9)",
    ),
    Custom(
        "read-outside",
        "#22",
        "read an outside file (a 'secret')",
        every(ALLOWED),
        prepare=_secret,
        script=lambda a, s: f"cat {q(s.out / 'secret.txt')}",
        happened=lambda a, s, r: f"secret-{s.token}" in r.stdout,
        note="reads are never restricted (documented, not an escape)",
    ),
    Custom(
        "tcp-loopback",
        "#24",
        "TCP connect to a host loopback listener (network: deny)",
        every(DENIED),
        prepare=_tcp_listener,
        close=_close_sock,
        happened=_accepted,
        script=_connect_script("tcp"),
        note="bwrap: --unshare-net; Landlock: ABI 4 TCP connect denial",
    ),
    Custom(
        "udp-loopback",
        "#24",
        "UDP datagram to a host loopback socket (network: deny)",
        cells(PRIVATE, PRIVATE, gap(UDP), gap(UDP)),
        prepare=_udp_receiver,
        close=_close_sock,
        happened=_udp_received,
        script=_udp_script,
        note="bwrap: delivered to the sandbox's own loopback (private net ns)",
    ),
    Custom(
        "abstract-unix",
        "#26",
        "connect to a host abstract UNIX socket (network: deny)",
        every(DENIED),
        prepare=_unix_listener(abstract=True),
        close=_close_sock,
        happened=_accepted,
        script=_connect_script("unix"),
        note="bwrap: own net ns; Landlock: ABI 6 scoping",
    ),
    Custom(
        "pathname-unix",
        "#25",
        "connect to a host pathname UNIX socket",
        every(DENIED),
        prepare=_unix_listener(abstract=False),
        close=_close_sock,
        happened=_accepted,
        script=_connect_script("unix"),
        note="seccomp: socket(AF_UNIX) refused (unix_sockets: deny)",
    ),
    Custom(
        "pathname-unix-allow",
        "#25",
        "pathname UNIX socket outside /tmp and /run (unix_sockets: allow)",
        every(ALLOWED),
        unix_sockets="allow",
        prepare=_unix_listener(abstract=False),
        close=_close_sock,
        happened=_accepted,
        script=_connect_script("unix"),
        note="control: the seccomp rule is what blocks a socket file elsewhere",
    ),
    Custom(
        "tcp-loopback-allow",
        "#24",
        "TCP connect to a host listener (network: allow)",
        every(ALLOWED),
        network="allow",
        prepare=_tcp_listener,
        close=_close_sock,
        happened=_accepted,
        script=_connect_script("tcp"),
        note="control: deny is what blocks",
    ),
    Custom(
        "abstract-unix-allow",
        "#26",
        "abstract UNIX socket (network: allow, unix_sockets: allow)",
        cells(ALLOWED, ALLOWED, DENIED, DENIED),
        network="allow",
        unix_sockets="allow",
        prepare=_unix_listener(abstract=True),
        close=_close_sock,
        happened=_accepted,
        script=_connect_script("unix"),
        note="Landlock scopes abstract sockets regardless",
    ),
]


# -- issue 15: host services, processes that outlive the call, host IPC --------------------------


def _unix_listener_at(where: Any) -> Any:
    """A real listening UNIX socket at ``where(scene)`` (e.g. under host /tmp or /run)."""

    def prepare(a: Attempt, s: Scene) -> None:
        path = Path(where(s))
        path.parent.mkdir(parents=True, exist_ok=True)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(str(path))
        sock.listen(8)
        a.state["sock"] = sock
        a.state["addr"] = str(path)
        a.state["cleanup"] = path.parent if path.parent.name.startswith("dsh-sbx-") else path

    return prepare


def _close_unix_listener(a: Attempt, s: Scene) -> None:
    a.state["sock"].close()
    target: Path = a.state["cleanup"]
    if target.is_dir():
        for child in target.iterdir():
            child.unlink()
        target.rmdir()
    elif target.exists():
        target.unlink()


PG_SOCKET = Path("/var/run/postgresql/.s.PGSQL.5432")


def _pg_connected(a: Attempt, s: Scene, result: Any) -> bool:
    # A foreign server's accept queue is not observable from here: the connect's own report.
    return "connected" in result.stdout


def _escapee_marker(a: Attempt, s: Scene) -> str:
    return f"1000.{os.getpid()}{abs(hash(s.token)) % 10**6}"


def _escapee_script(a: Attempt, s: Scene) -> str:
    # Leaves the call's process group and session, ignores SIGHUP, closes the call's pipes.
    return f"setsid nohup sleep {_escapee_marker(a, s)} </dev/null >/dev/null 2>&1 & echo started"


def _in_host_pid_namespace(pid: int) -> bool:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid") == os.readlink("/proc/self/ns/pid")
    except OSError:  # gone already
        return False


def _escapee_alive(a: Attempt, s: Scene, result: Any) -> bool:
    # The runner may exit a moment before the kernel has torn its PID namespace down (bwrap's
    # outer process does not wait for its init), so an escapee inside a PID namespace has
    # "outlived the call" only if it is still alive after a bounded wait (10 s: hang
    # protection; a contained escapee is gone long before). One alive in the host's own PID
    # namespace after the call returned has outlived it: nothing is left to tear it down.
    # Gone means absent on three looks in a row: a process caught inside execve (bash → setsid
    # → nohup → sleep) can read as an empty command line for an instant.
    marker = _escapee_marker(a, s)
    absent = 0
    for _ in range(100):
        alive = sleepers(marker)
        if not alive:
            absent += 1
            if absent == 3:
                return False
        else:
            absent = 0
            if any(_in_host_pid_namespace(pid) for pid in alive):
                return True
        time.sleep(0.1)
    return bool(sleepers(marker))


def _kill_escapee(a: Attempt, s: Scene) -> None:
    for pid in sleepers(_escapee_marker(a, s)):  # only what this attempt started
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _open_pty(a: Attempt, s: Scene) -> None:
    """A host terminal with typed input waiting (what a user's keystrokes look like)."""
    master, slave = os.openpty()
    a.state["pty"] = (master, slave)
    a.state["tty"] = os.ttyname(slave)
    os.write(master, f"typed-{s.token[-6:]}\n".encode())


def _close_pty(a: Attempt, s: Scene) -> None:
    for fd in a.state["pty"]:
        os.close(fd)


def _libc() -> Any:
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


def _ipc_key(s: Scene) -> int:
    return 0x05B00000 + abs(hash(s.token)) % 0xFFFFF


def _shm_exists(a: Attempt, s: Scene, result: Any) -> bool:
    key = _ipc_key(s)
    lines = Path("/proc/sysvipc/shm").read_text().splitlines()[1:]
    return any(int(line.split()[0]) == key for line in lines)


def _shm_remove(a: Attempt, s: Scene) -> None:
    libc = _libc()
    shmid = libc.shmget(_ipc_key(s), 0, 0)
    if shmid >= 0:
        libc.shmctl(shmid, 0, None)  # IPC_RMID


def _mq_name(s: Scene) -> bytes:
    return f"/dsh-sbx-{s.token[-12:]}".encode()


def _mq_exists(a: Attempt, s: Scene, result: Any) -> bool:
    libc = _libc()
    fd = libc.mq_open(_mq_name(s), os.O_RDONLY)
    if fd < 0:
        return False
    os.close(fd)
    return True


def _mq_remove(a: Attempt, s: Scene) -> None:
    _libc().mq_unlink(_mq_name(s))


def _key_name(s: Scene) -> str:
    return f"dsh-sbx-{s.token[-12:]}"


def _key_in_user_keyring(a: Attempt, s: Scene, result: Any) -> bool:
    return any(f" {_key_name(s)}: " in line for line in Path("/proc/keys").read_text().splitlines())


def _key_remove(a: Attempt, s: Scene) -> None:
    import ctypes

    libc = _libc()
    libc.syscall.restype = ctypes.c_long
    for line in Path("/proc/keys").read_text().splitlines():
        if f" {_key_name(s)}: " in line:
            libc.syscall(
                ctypes.c_long(KEYCTL), ctypes.c_long(3), ctypes.c_long(int(line.split()[0], 16))
            )


_NR = {"x86_64": (248, 250), "aarch64": (217, 219), "riscv64": (217, 219)}
ADD_KEY, KEYCTL = _NR.get(os.uname().machine, (248, 250))


ISSUE_15: list[Attempt] = [
    Custom(
        "tmp-unix-socket",
        "i15 #3",
        "connect to a host UNIX socket under /tmp (a tmux server's)",
        every(DENIED),
        prepare=_unix_listener_at(lambda s: f"/tmp/dsh-sbx-{s.token}/default"),
        close=_close_unix_listener,
        happened=_accepted,
        script=_connect_script("unix"),
        note="seccomp: socket(AF_UNIX) refused",
    ),
    Custom(
        "run-unix-socket",
        "i15 #3",
        "connect to a host UNIX socket under /run (D-Bus, docker, ...)",
        every(DENIED),
        prepare=_unix_listener_at(lambda s: f"/run/dsh-sbx-{s.token}.sock"),
        close=_close_unix_listener,
        happened=_accepted,
        script=_connect_script("unix"),
        note="seccomp: socket(AF_UNIX) refused",
    ),
    Custom(
        "tmp-unix-socket-hidden",
        "i15 #3",
        "UNIX socket under /tmp with unix_sockets: allow",
        every(DENIED),
        unix_sockets="allow",
        prepare=_unix_listener_at(lambda s: f"/tmp/dsh-sbx-{s.token}/default"),
        close=_close_unix_listener,
        happened=_accepted,
        script=_connect_script("unix"),
        note="private /tmp: the host's is not even visible",
    ),
    Custom(
        "run-unix-socket-hidden",
        "i15 #3",
        "UNIX socket under /run with unix_sockets: allow",
        every(DENIED),
        unix_sockets="allow",
        prepare=_unix_listener_at(lambda s: f"/run/dsh-sbx-{s.token}.sock"),
        close=_close_unix_listener,
        happened=_accepted,
        script=_connect_script("unix"),
        note="/run is an empty private tmpfs",
    ),
    Custom(
        "postgres-socket",
        "i15 #3",
        "connect to the real PostgreSQL socket (/var/run/postgresql)",
        every(DENIED),
        happened=_pg_connected,
        script=lambda a, s: py(
            "import socket; c = socket.socket(socket.AF_UNIX); c.settimeout(20); "
            f"c.connect({str(PG_SOCKET)!r}); print('connected')"
        ),
        note="judged by the connect's own report (a foreign server's queue is not observable)",
    ),
    Custom(
        "setsid-escapee",
        "i15 #6",
        "`setsid nohup sleep &`: a process that outlives the call",
        every(CONTAINED),
        close=_kill_escapee,
        happened=_escapee_alive,
        script=_escapee_script,
        note="bwrap: PID namespace; Landlock: the launcher's PID namespace (root)",
    ),
    Custom(
        "host-pty-read",
        "i15 #6",
        "read typed input from a host terminal (/dev/pts/N)",
        every(DENIED),
        prepare=_open_pty,
        close=_close_pty,
        happened=lambda a, s, r: f"typed-{s.token[-6:]}" in r.stdout,
        script=lambda a, s: f"timeout 10 head -c 13 {q(a.state['tty'])}",
        note="bwrap: own devpts; Landlock: private /dev/pts (root)",
    ),
    Custom(
        "sysv-shm",
        "i15 #11",
        "create a System V shared memory segment",
        every(PRIVATE),
        close=_shm_remove,
        happened=_shm_exists,
        script=lambda a, s: py(
            "import ctypes, sys; l = ctypes.CDLL(None); "
            f"sys.exit(0 if l.shmget({_ipc_key(s)}, 4096, 0o1600) >= 0 else 1)"
        ),
        note="IPC namespace: the segment dies with the call",
    ),
    Custom(
        "posix-mqueue",
        "i15 #11",
        "create a POSIX message queue",
        cells(PRIVATE, PRIVATE, DENIED, DENIED),
        close=_mq_remove,
        happened=_mq_exists,
        script=lambda a, s: py(
            "import ctypes, os, sys; l = ctypes.CDLL(None); "
            f"sys.exit(0 if l.mq_open({_mq_name(s)!r}, os.O_CREAT | os.O_RDWR, 0o600, None) >= 0 "
            "else 1)"
        ),
        note="bwrap: IPC namespace; Landlock: the queue file is not beneath any grant",
    ),
    Custom(
        "user-keyring",
        "i15 #11",
        "store a key in the user keyring (@u)",
        every(DENIED),
        close=_key_remove,
        happened=_key_in_user_keyring,
        script=lambda a, s: py(
            "import ctypes, sys; l = ctypes.CDLL(None); l.syscall.restype = ctypes.c_long; "
            f"k = l.syscall(ctypes.c_long({ADD_KEY}), b'user', {_key_name(s).encode()!r}, b'x', "
            "ctypes.c_long(1), ctypes.c_long(-4)); sys.exit(0 if k > 0 else 1)"
        ),
        note="seccomp: add_key/keyctl/request_key refused",
    ),
]


def _plant_repo(a: Attempt, s: Scene) -> None:
    """A workspace with a git repository, a virtualenv and the harness's own config."""
    hooks = s.ws / ".git" / "hooks"
    hooks.mkdir(parents=True)
    a.state["git-config"] = make_victim(s.ws / ".git" / "config", b"[core]\n")
    site = s.ws / ".venv" / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    (s.ws / ".venv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    a.state["dsh-yml"] = make_victim(s.ws / "dsh.yml", b"plugins: []\n")
    (s.ws / ".dsh").mkdir()


def _planted(path: Any) -> Any:
    return lambda a, s, r: os.path.lexists(path(s))


ISSUE_15_CLASS_9: list[Attempt] = [
    Custom(
        "git-hook",
        "i15 #9",
        "plant .git/hooks/pre-commit in the workspace",
        every(DENIED),
        prepare=_plant_repo,
        script=lambda a, s: f"echo 'id > /tmp/pwned' > {q(s.ws / '.git/hooks/pre-commit')}",
        happened=_planted(lambda s: s.ws / ".git/hooks/pre-commit"),
        denial_dialect=True,
        note="read-only bind of the workspace's .git (Landlock: in its mount namespace)",
    ),
    Custom(
        "git-config",
        "i15 #9",
        "set core.fsmonitor in the workspace's .git/config",
        every(DENIED),
        prepare=_plant_repo,
        script=lambda a, s: f"printf '[core]\\n\\tfsmonitor = id\\n' >> {q(s.ws / '.git/config')}",
        happened=lambda a, s, r: changed(s.ws / ".git/config", a.state["git-config"]),
        denial_dialect=True,
    ),
    Custom(
        "venv-pth",
        "i15 #9",
        "drop a .pth file into a workspace virtualenv",
        every(DENIED),
        prepare=_plant_repo,
        script=lambda a, s: (
            f"echo 'import os' > {q(s.ws / '.venv/lib/python3.11/site-packages/evil.pth')}"
        ),
        happened=_planted(lambda s: s.ws / ".venv/lib/python3.11/site-packages/evil.pth"),
        denial_dialect=True,
        note="a direct child holding pyvenv.cfg is a virtualenv",
    ),
    Custom(
        "dsh-config",
        "i15 #9",
        "rewrite the workspace's dsh.yml, or plant .dsh/<file>",
        every(DENIED),
        prepare=_plant_repo,
        script=lambda a, s: (
            f"echo 'plugins: [evil]' > {q(s.ws / 'dsh.yml')}; r1=$?; "
            f"echo x > {q(s.ws / '.dsh/planted')}; r2=$?; [ $r1 -eq 0 ] || [ $r2 -eq 0 ]"
        ),
        happened=lambda a, s, r: (
            changed(s.ws / "dsh.yml", a.state["dsh-yml"]) or (s.ws / ".dsh/planted").exists()
        ),
    ),
]

CATALOG += ISSUE_15 + ISSUE_15_CLASS_9


ATTEMPTS = {a.id: a for a in CATALOG}
assert len(ATTEMPTS) == len(CATALOG), "duplicate attempt ids"


def markdown_table() -> str:
    """The outcome table (README and closing note), generated from the catalog itself."""
    label = {
        DENIED: "denied",
        ALLOWED: "allowed",
        PRIVATE: "private (host unchanged)",
        CONTAINED: "contained (died with the call)",
    }

    def cell(outcome: str) -> str:
        if outcome.startswith("gap:"):
            return f"**allowed — partial** (`{outcome[4:]}` in not_covered)"
        return label[outcome]

    lines = [
        "| attempt | spec | network | bwrap RO | bwrap WW | Landlock RO | Landlock WW | note |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for a in CATALOG:
        row = [cell(a.expect[(b, m)]) for b in ("bubblewrap", "landlock")
               for m in ("read-only", "workspace-write")]  # fmt: skip
        lines.append(
            f"| {a.title} (`{a.id}`) | {a.spec} | {a.network} | "
            + " | ".join(row)
            + f" | {a.note} |"
        )
    return "\n".join(lines) + "\n"
