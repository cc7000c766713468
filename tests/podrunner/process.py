"""One container as a local process: its own session (so the whole process group can be
signalled), its own private mount namespace with the pod's volumes bind-mounted at their
``mountPath``, stdout and stderr appended to a log file.

The chain is ``setpriv --pdeathsig KILL`` (the process dies with the runner thread that started
it) → ``unshare --mount --propagation private`` → ``sh -c <mounts; cd; exec "$@">`` → the
container's command, all ``exec``-ed in turn, so the pid the runner holds is the pid of the
command itself. A pod with a network of its own (``tests.podrunner.podnet``) adds
``nsenter --net=<its netns>`` before ``unshare``, and ``--uts`` with the pod's hostname set first
thing in the script. Needs root (mounts) and util-linux.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

# Absolute paths: the container's PATH may be anything its pod spec says.
SETPRIV = shutil.which("setpriv") or "/usr/bin/setpriv"
UNSHARE = shutil.which("unshare") or "/usr/bin/unshare"
NSENTER = shutil.which("nsenter") or "/usr/bin/nsenter"
MOUNT = shutil.which("mount") or "/usr/bin/mount"
SH = "/bin/sh"


@dataclass(frozen=True)
class Mount:
    """``source`` (a host folder or file) bind-mounted at ``target`` inside the container."""

    source: Path
    target: str
    read_only: bool = False
    is_file: bool = False


@dataclass(frozen=True)
class Identity:
    """The network and host name of a pod with a network of its own: its containers enter the
    network namespace at ``netns`` (a path such as /run/netns/NAME) and get a UTS namespace
    named ``hostname``."""

    netns: str
    hostname: str


def _mount_script(mounts: list[Mount], working_dir: str | None, hostname: str | None) -> str:
    """Shell lines run inside the new mount namespace before the command is exec-ed. Missing
    mount points are created on the host filesystem (empty folders or files, left in place)."""
    q = shlex.quote
    lines = ["set -e"]
    if hostname:  # kernel.hostname belongs to the new UTS namespace
        lines.append(f"printf %s {q(hostname)} > /proc/sys/kernel/hostname")
    for m in mounts:
        if m.is_file:
            parent = os.path.dirname(m.target) or "/"
            lines.append(f"mkdir -p {q(parent)}; [ -e {q(m.target)} ] || : > {q(m.target)}")
        else:
            lines.append(f"mkdir -p {q(m.target)}")
        lines.append(f"{MOUNT} --bind {q(str(m.source))} {q(m.target)}")
        if m.read_only:
            lines.append(f"{MOUNT} -o remount,bind,ro {q(m.target)}")
    if working_dir:
        lines.append(f"mkdir -p {q(working_dir)}; cd {q(working_dir)}")
    lines.append('exec "$@"')
    return "\n".join(lines)


def launch(
    argv: list[str],
    env: dict[str, str],
    mounts: list[Mount],
    working_dir: str | None,
    log_path: Path,
    identity: Identity | None = None,
) -> subprocess.Popen[bytes]:
    """Starts ``argv`` with ``env`` in a new session and a private mount namespace (and in the
    pod's network and UTS namespaces with an ``identity``)."""
    enter = [NSENTER, f"--net={identity.netns}", "--"] if identity else []
    uts = ["--uts"] if identity else []
    wrapper = [
        SETPRIV,
        "--pdeathsig",
        "KILL",
        "--",
        *enter,
        UNSHARE,
        "--mount",
        *uts,
        "--propagation",
        "private",
        "--",
        SH,
        "-c",
        _mount_script(mounts, working_dir, identity.hostname if identity else None),
        "container",  # $0 of the script
        *argv,
    ]
    with log_path.open("ab") as log:
        return subprocess.Popen(
            wrapper,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd="/",
        )


def exit_code(returncode: int) -> int:
    """A container runtime's exit code: 128 + n for a process killed by signal n."""
    return 128 - returncode if returncode < 0 else returncode


def signal_group(pid: int, sig: signal.Signals) -> None:
    """Signals the container's whole process group; gone already is fine."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def hold_mount_ns(pid: int) -> tuple[str, int]:
    """(the mount namespace of ``pid``, an open fd on it) once it entered the container's own
    (its ``unshare`` ran); ("", -1) before that, or when it is gone. The fd keeps the namespace,
    and with it its inode number, from being reused by another container's namespace after this
    one's processes are gone: close it with ``release_mount_ns``."""
    try:
        fd = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return "", -1
    ns = os.readlink(f"/proc/self/fd/{fd}")
    if ns == os.readlink("/proc/self/ns/mnt"):
        os.close(fd)
        return "", -1
    return ns, fd


def await_mount_ns(proc: subprocess.Popen[bytes], timeout_s: float = 10.0) -> tuple[str, int]:
    """``hold_mount_ns`` of a container just launched, once its ``unshare`` ran: the command
    starts only after that, so every process it starts is in the namespace returned.
    ("", -1) when the process ended first, or after ``timeout_s``. Taken when the container
    starts, not on the runner's next beat: a pod deleted before that beat would otherwise leave a
    child in a session of its own alive, since only the namespace finds it."""
    deadline = time.monotonic() + timeout_s
    while True:
        ns, fd = hold_mount_ns(proc.pid)
        if ns or proc.poll() is not None or time.monotonic() >= deadline:
            return ns, fd
        time.sleep(0.002)


def release_mount_ns(fd: int) -> None:
    if fd >= 0:
        with contextlib.suppress(OSError):
            os.close(fd)


def kill_leftovers(ns: str) -> int:
    """SIGKILL to every process still in the container's mount namespace ``ns`` (held open by
    ``hold_mount_ns``, so that it names this container's namespace only), as a container
    runtime ends a container's processes with it: a child that started a session of its own
    (torchrun's workers) escapes a process-group signal and outlives its parent. Returns how
    many were signalled."""
    if not ns:
        return 0
    killed = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.readlink(entry / "ns" / "mnt") != ns:
                continue
            os.kill(int(entry.name), signal.SIGKILL)
            killed += 1
        except (OSError, ProcessLookupError):
            continue  # gone meanwhile
    return killed


def stop(procs: list[subprocess.Popen[bytes]], deadline: float) -> None:
    """SIGTERM to each process group, SIGKILL to what is still alive at ``deadline`` (a
    ``time.monotonic()`` value). Leaves the processes un-reaped for the caller's ``poll``."""
    alive = [p for p in procs if p.poll() is None]
    for p in alive:
        signal_group(p.pid, signal.SIGTERM)
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [p for p in alive if p.poll() is None]
    for p in alive:
        signal_group(p.pid, signal.SIGKILL)
    for p in alive:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=10)


def which(command: str, path: str) -> str | None:
    """Where ``command`` resolves with the container's PATH; None when it does not."""
    if command.startswith("/"):
        return command if os.access(command, os.X_OK) else None
    if "/" in command:  # relative to the working folder, which exists only inside the container
        return command
    return shutil.which(command, path=path)
