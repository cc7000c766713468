"""One container of the local pod runner (tests/podrunner/process.py) as real processes, with no
control plane: its mount namespace is known as soon as it is launched, so a child in a session of
its own ends with it however soon the container is stopped."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from tests.integration.support import pid_alive, wait_for
from tests.podrunner.process import (
    Identity,
    await_mount_ns,
    kill_leftovers,
    launch,
    release_mount_ns,
    signal_group,
)


def _launch(script: str, tmp_path: Path) -> subprocess.Popen[bytes]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    return launch(["sh", "-c", script], env, [], None, tmp_path / "log")


ROUNDS = 20  # each a fresh container, stopped as soon as its child is there


def test_the_namespace_is_held_from_launch_and_finds_a_child_in_its_own_session(
    tmp_path: Path,
) -> None:
    """Stopped right after it started its child, before any later look: the namespace taken at
    launch still finds the child that left the container's process group."""
    for i in range(ROUNDS):
        _stop_right_after_the_child_started(tmp_path / f"child-{i}.pid", tmp_path)


def _stop_right_after_the_child_started(pidfile: Path, tmp_path: Path) -> None:
    proc = _launch(f"setsid sleep 600 & echo $! > {pidfile}; sleep 300", tmp_path)
    ns, fd = await_mount_ns(proc)
    child = 0
    try:
        assert ns, "no mount namespace of its own when launch returned"
        assert ns != os.readlink("/proc/self/ns/mnt")
        child = wait_for(lambda: pidfile.exists() and int(pidfile.read_text() or 0), 10, "child")
        assert os.readlink(f"/proc/{child}/ns/mnt") == ns
        # ``$!`` is known from the fork, before the child's setsid: wait for its session.
        wait_for(lambda: os.getsid(child) == child, 10, "the child's own session")
        assert os.getpgid(child) != proc.pid  # out of reach of a process-group signal
        signal_group(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        assert pid_alive(child)
        # The child, and maybe the shell's foreground ``sleep``, still exiting from the SIGKILL.
        assert kill_leftovers(ns) >= 1
        wait_for(lambda: not pid_alive(child), 10, "the child gone")
    finally:
        signal_group(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        if child and pid_alive(child):
            os.kill(child, signal.SIGKILL)
        release_mount_ns(fd)


def test_a_container_that_ends_before_its_namespace_gives_none(tmp_path: Path) -> None:
    """A container that ends before its ``unshare`` ran (here ``nsenter`` finds no network
    namespace): no namespace, and the process is seen to have ended."""
    identity = Identity(netns=str(tmp_path / "no-such-netns"), hostname="none")
    proc = launch(["true"], {"PATH": "/usr/bin:/bin"}, [], None, tmp_path / "log", identity)
    assert await_mount_ns(proc) == ("", -1)
    assert proc.returncode not in (None, 0)
