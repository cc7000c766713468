"""The local environment: its listening ports stay out of the kernel's range for outgoing
connections, so a server stopped and started again finds its ports free; what of it is down is
found before a test waits on it; and a stopped SeaweedFS leaves none of its socket files in
/tmp."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

from tests import localenv


@pytest.mark.parametrize(
    ("ephemeral", "expected"),
    [
        (range(32768, 61000), 10000),  # Linux's default: every listening port is outside
        (range(25000, 26000), 9000),
        (range(15000, 22000), 8000),
        (range(1024, 65536), 0),  # the whole space is ephemeral: nothing left
    ],
)
def test_listen_candidates_leave_out_the_ephemeral_range(ephemeral: range, expected: int) -> None:
    ports = localenv.listen_candidates(ephemeral)
    assert len(ports) == expected
    assert len(set(ports)) == len(ports)
    assert not [p for p in ports if p in ephemeral]
    assert all(p in localenv.LISTEN_PORTS for p in ports)


def test_ephemeral_ports_read_the_kernel_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    setting = tmp_path / "ip_local_port_range"
    setting.write_text("40000\t50000\n")
    monkeypatch.setattr(localenv, "EPHEMERAL_PORTS_FILE", setting)
    assert localenv.ephemeral_ports() == range(40000, 50001)
    monkeypatch.setattr(localenv, "EPHEMERAL_PORTS_FILE", tmp_path / "missing")
    assert localenv.ephemeral_ports() == range(32768, 61000)


def test_free_ports_are_distinct_bindable_and_outside_the_ephemeral_range() -> None:
    ephemeral = localenv.ephemeral_ports()
    ports = localenv.free_ports(localenv.SEAWEEDFS_PORTS)
    assert len(set(ports)) == localenv.SEAWEEDFS_PORTS
    assert not [p for p in ports if p in ephemeral]
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", port))


@pytest.fixture
def listener() -> Iterator[int]:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_a_port_in_use_is_passed_over(listener: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(localenv, "listen_candidates", lambda _: [listener, *range(20000, 20100)])
    ports = localenv.free_ports(3)
    assert listener not in ports
    assert len(set(ports)) == 3


def test_a_range_with_too_few_candidates_is_filled_by_the_kernel(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(localenv, "ephemeral_ports", lambda: range(1024, 65536))
    ports = localenv.free_ports(4)
    assert len(set(ports)) == 4
    assert all(p > 0 for p in ports)


GiB = 1 << 30


class Usage(NamedTuple):  # shutil.disk_usage's fields
    total: int
    used: int
    free: int


def disk(total_gib: float, free_gib: float) -> Usage:
    return Usage(int(total_gib * GiB), int((total_gib - free_gib) * GiB), int(free_gib * GiB))


@pytest.fixture
def env_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Path]]:
    """An environment's state folder and cluster folder under ``tmp_path``, as localenv lays
    them out; a sleeping process stands in for each server."""
    monkeypatch.setattr(localenv, "CACHE", tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda _path: disk(252, 100))
    name = "tr-test"
    sdir = localenv.state_dir(name)
    sdir.mkdir(parents=True)
    pids = tmp_path / "kwok" / "clusters" / name / "pids"
    pids.mkdir(parents=True)
    yield name, sdir


def sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


@pytest.mark.parametrize("down", ["nothing", "seaweedfs", "seaweedfs-unreaped", "apiserver"])
def test_broken_names_what_is_down(env_state: tuple[str, Path], down: str) -> None:
    name, sdir = env_state
    weed, api = sleeper(), sleeper()
    try:
        (sdir / "env.json").write_text(json.dumps({"seaweedfs_pid": weed.pid}))
        (sdir / "seaweedfs.log").write_text("F1128 bind: address already in use\n")
        pids = localenv.CACHE / "kwok" / "clusters" / name / "pids"
        (pids / "kube-apiserver.pid").write_text(f"{api.pid}\n")
        if down.startswith("seaweedfs"):
            weed.kill()
            if down == "seaweedfs":
                weed.wait()
            else:  # exited, not yet reaped: a zombie still answers kill(pid, 0)
                deadline = time.monotonic() + 10
                while localenv._pid_alive(weed.pid) and time.monotonic() < deadline:
                    time.sleep(0.01)
        elif down == "apiserver":
            api.kill()
            api.wait()

        problem = localenv.broken(name)

        if down == "nothing":
            assert problem is None
        elif down == "apiserver":
            assert problem is not None
            assert f"kube-apiserver (pid {api.pid}) is not running" in problem
            assert "kube-apiserver.log" in problem
        else:
            assert problem is not None
            assert f"SeaweedFS (pid {weed.pid}) is not running" in problem
            assert "address already in use" in problem
    finally:
        for proc in (weed, api):
            proc.kill()
            proc.wait()


def test_broken_without_state(env_state: tuple[str, Path]) -> None:
    name, _ = env_state
    problem = localenv.broken(name)
    assert problem is not None and "env.json" in problem


@pytest.mark.parametrize(
    ("total_gib", "free_gib", "short"),
    [
        (252, 2.1, True),  # this machine's disk when SeaweedFS refused writes
        (252, 3.9, True),
        (252, 4.0, False),
        (1000, 10.0, True),  # 1% of it and 1 GiB more: 11 GiB
        (1000, 11.0, False),
    ],
)
def test_broken_names_a_disk_too_full_for_seaweedfs(
    env_state: tuple[str, Path],
    monkeypatch: pytest.MonkeyPatch,
    total_gib: float,
    free_gib: float,
    short: bool,
) -> None:
    name, sdir = env_state
    weed = sleeper()
    try:
        (sdir / "env.json").write_text(json.dumps({"seaweedfs_pid": weed.pid}))
        monkeypatch.setattr(shutil, "disk_usage", lambda _path: disk(total_gib, free_gib))
        problem = localenv.broken(name)
    finally:
        weed.kill()
        weed.wait()
    if short:
        assert problem is not None
        assert f"{free_gib:.1f} GiB free on the disk of {sdir}" in problem
        assert "python -m tests.localenv down" in problem
    else:
        assert problem is None


# A server that takes 0.5 s to stop on SIGTERM and leaves a mark when it did.
SLOW_STOP = """
import signal, sys, time
from pathlib import Path
def stop(*_):
    time.sleep(0.5)
    Path(sys.argv[1]).write_text("stopped")
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
Path(sys.argv[2]).write_text("ready")
time.sleep(60)
"""


@pytest.mark.parametrize("keep_data", [True, False])
def test_stop_seaweedfs_lets_it_stop_on_its_own_only_when_its_data_is_kept(
    keep_data: bool, tmp_path: Path
) -> None:
    mark, ready = tmp_path / "stopped", tmp_path / "ready"
    server = subprocess.Popen(
        [sys.executable, "-c", SLOW_STOP, str(mark), str(ready)], start_new_session=True
    )
    try:
        deadline = time.monotonic() + 10
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert ready.exists(), "the server did not start within 10 s"
        localenv.stop_seaweedfs(server.pid, keep_data=keep_data)
        assert server.wait(timeout=5) == (0 if keep_data else -9)
        assert mark.exists() == keep_data
    finally:
        server.kill()


def test_stop_seaweedfs_removes_the_grpc_sockets_it_leaves_in_tmp() -> None:
    # Port numbers no real server has, so no running SeaweedFS's files are touched.
    master, s3 = 70000 + os.getpid() % 10000, 80000 + os.getpid() % 10000
    args = [f"-master.port.grpc={master}", f"-s3.port.grpc={s3}", "-volume.port=1"]
    weed = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", *args], start_new_session=True
    )
    # Its command line is the one given only once the child has exec'd.
    cmdline = Path(f"/proc/{weed.pid}/cmdline")
    deadline = time.monotonic() + 10
    while b"-volume.port=1" not in cmdline.read_bytes() and time.monotonic() < deadline:
        time.sleep(0.01)
    paths = [Path(localenv.GRPC_SOCKET.format("master", master))]
    paths.append(Path(localenv.GRPC_SOCKET.format("s3", s3)))
    other = Path(localenv.GRPC_SOCKET.format("filer", master))  # not this process's: kept
    listeners = []
    try:
        for path in [*paths, other]:
            path.unlink(missing_ok=True)
            sock = socket.socket(socket.AF_UNIX)
            sock.bind(str(path))
            listeners.append(sock)
        assert localenv.grpc_sockets(weed.pid) == paths
        assert localenv.seaweedfs_flags(weed.pid)["volume.port"] == "1"
        localenv.stop_seaweedfs(weed.pid)
        weed.wait(timeout=20)
        assert not localenv._pid_alive(weed.pid)
        assert localenv.seaweedfs_flags(weed.pid) == {}
        assert [p.exists() for p in paths] == [False, False]
        assert other.is_socket()
    finally:
        weed.kill()
        for sock in listeners:
            sock.close()
        for path in [*paths, other]:
            path.unlink(missing_ok=True)
