"""Stopping and starting the environment's own servers as a fault: the kube-apiserver kwokctl
started, and SeaweedFS. Each is started again exactly as it was (its command line, working
folder and environment, read from /proc), on the same ports and data, and the pid files that
``tests.localenv`` and kwokctl keep are updated so ``make cluster-down`` still stops it."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests import localenv


@dataclass(frozen=True)
class Launch:
    """How a running process was started."""

    argv: list[str]
    cwd: str
    env: dict[str, str]

    @classmethod
    def of(cls, pid: int) -> Launch:
        proc = Path(f"/proc/{pid}")
        argv = [a.decode() for a in proc.joinpath("cmdline").read_bytes().split(b"\0") if a]
        pairs = [e.decode() for e in proc.joinpath("environ").read_bytes().split(b"\0") if e]
        env = dict(p.split("=", 1) for p in pairs if "=" in p)
        return cls(argv, os.readlink(proc / "cwd"), env)

    def start(self, log: Path) -> int:
        with log.open("ab") as out:
            proc = subprocess.Popen(
                self.argv,
                cwd=self.cwd,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return proc.pid


def cluster_dir(env: localenv.LocalEnv) -> Path:
    return localenv.CACHE / "kwok" / "clusters" / env.name


# What a node's supervisor (the kubelet of static pods, systemd) restarts when it exits: the
# scheduler and the controller manager exit when they lose their leader election, as they do
# while the API server is down; kwokctl's binary runtime does not start them again.
SUPERVISED = ("kube-controller-manager", "kube-scheduler", "kwok-controller")


def components(env: localenv.LocalEnv) -> dict[str, dict[str, Any]]:
    """The control plane's components as kwokctl wrote them down (binary, args, workDir)."""
    documents = yaml.safe_load_all((cluster_dir(env) / "kwok.yaml").read_text())
    found = {}
    for doc in documents:
        for c in (doc or {}).get("components") or []:
            found[c["name"]] = c
    return found


def supervise(env: localenv.LocalEnv) -> list[str]:
    """Starts again each of ``SUPERVISED`` that is not running, as kwokctl started it; returns
    the names of those it started."""
    cdir = cluster_dir(env)
    started = []
    for name, component in components(env).items():
        if name not in SUPERVISED:
            continue
        pid_file = cdir / "pids" / f"{name}.pid"
        with contextlib.suppress(FileNotFoundError, ValueError):
            if localenv._pid_alive(int(pid_file.read_text().strip())):
                continue
        launch = Launch(
            [component["binary"], *component.get("args", [])],
            component.get("workDir") or str(cdir),
            dict(os.environ),
        )
        pid_file.write_text(str(launch.start(cdir / "logs" / f"{name}.log")))
        started.append(name)
    return started


def restart_apiserver(env: localenv.LocalEnv, down_s: float = 2.0) -> float:
    """SIGKILLs the kube-apiserver, starts it again after ``down_s``; returns the seconds until
    it answered /readyz again (bounded by localenv.READY_TIMEOUT_S)."""
    cdir = cluster_dir(env)
    pid_file = cdir / "pids" / "kube-apiserver.pid"
    pid = int(pid_file.read_text().strip())
    launch = Launch.of(pid)
    killed = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    if not localenv.wait_gone(pid, 30):
        raise RuntimeError(f"kube-apiserver pid {pid} outlived SIGKILL by 30 s")
    time.sleep(down_s)
    pid_file.write_text(str(launch.start(cdir / "logs" / "kube-apiserver.log")))
    deadline = time.monotonic() + localenv.READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if localenv._api_ready(Path(env.bin_dir), Path(env.kubeconfig)):
            return time.monotonic() - killed
        time.sleep(0.5)
    raise RuntimeError(f"kube-apiserver not ready {localenv.READY_TIMEOUT_S} s after restart")


def stop_seaweedfs(env: localenv.LocalEnv) -> tuple[Launch, int]:
    """Stops SeaweedFS the way an operator would (SIGTERM, then SIGKILL after 15 s)."""
    state = json.loads((localenv.state_dir(env.name) / "env.json").read_text())
    pid = int(state["seaweedfs_pid"])
    launch = Launch.of(pid)
    localenv.stop_pid(pid)
    if not localenv.wait_gone(pid, 30):
        raise RuntimeError(f"SeaweedFS pid {pid} still runs 30 s after it was stopped")
    return launch, pid


def start_seaweedfs(env: localenv.LocalEnv, launch: Launch) -> float:
    """Starts SeaweedFS again as it was; records its pid in env.json; returns the seconds until
    the bucket took a write again."""
    sdir = localenv.state_dir(env.name)
    started = time.monotonic()
    pid = launch.start(sdir / "seaweedfs.log")
    env_file = sdir / "env.json"
    state = json.loads(env_file.read_text())
    state["seaweedfs_pid"] = pid
    env_file.write_text(json.dumps(state, indent=2))
    now = dataclasses.replace(env, seaweedfs_pid=pid)
    localenv.wait_s3(now, sdir)
    localenv.ensure_bucket(now)
    return time.monotonic() - started
