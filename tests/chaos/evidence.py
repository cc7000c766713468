"""What a chaos run keeps when an invariant broke, before it deletes its namespace and stops its
pod runners: the real trainers' runs and pods as the API shows them, the container logs,
termination logs and pid files of their pods on the runner nodes, the runners' own logs, and
the processes still running. Kept under the run's work folder (``evidence/``), so a break can
be explained after the run."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

from kubernetes import client

from tests.podrunner import RunnerHandle
from trainingrun import api
from trainingrun.contract import LABEL_RUN

RUNNER_LOG_TAIL = 4 << 20  # bytes of each runner's own log kept (its end)
KEPT_SUFFIXES = (".log", ".termination-log", ".pid")  # and the pids of what still runs


def keep(
    core: client.CoreV1Api,
    custom: client.CustomObjectsApi,
    ns: str,
    runners: list[RunnerHandle],
    real: list[str],
    out: Path,
) -> Path:
    """Writes the evidence of the real trainers' runs under ``out``; returns it. Never raises
    for what it cannot read (the API server down, a folder gone): it notes it instead."""
    out.mkdir(parents=True, exist_ok=True)
    notes: list[str] = []
    sanitize = core.api_client.sanitize_for_serialization
    try:
        runs = custom.list_namespaced_custom_object(api.GROUP, api.VERSION, ns, api.PLURAL)
        kept = [r for r in runs["items"] if r["metadata"]["name"] in real]
        (out / "runs.json").write_text(json.dumps(kept, indent=1, default=str))
        pods = [
            sanitize(p)
            for p in core.list_namespaced_pod(ns).items
            if (p.metadata.labels or {}).get(LABEL_RUN) in real
        ]
        (out / "pods.json").write_text(json.dumps(pods, indent=1, default=str))
    except Exception as e:  # the report says what is missing, the run goes on to clean up
        notes.append(f"the API could not be read: {type(e).__name__}: {e}")
    for handle in runners:
        node_out = out / handle.node
        node_out.mkdir(exist_ok=True)
        notes += copy_pod_files(handle.state_dir, ns, real, node_out)
        if handle.log_path.exists():
            with handle.log_path.open("rb") as f:
                f.seek(max(0, handle.log_path.stat().st_size - RUNNER_LOG_TAIL))
                (node_out / "runner.log").write_bytes(f.read())
    ps = subprocess.run(
        ["ps", "-eo", "pid,ppid,stat,etime,time,args", "--forest"],
        capture_output=True,
        text=True,
        check=False,
    )
    (out / "ps.txt").write_text(ps.stdout)  # what still ran, and for how long
    (out / "notes.txt").write_text("\n".join(notes) + "\n")
    return out


def copy_pod_files(state_dir: Path, ns: str, real: list[str], out: Path) -> list[str]:
    """Copies the small files (logs, termination logs, pids) of each real trainer's pod folder
    under ``state_dir``; checkpoints and other data stay behind."""
    notes: list[str] = []
    for pod_dir in sorted(state_dir.glob(f"{ns}_*")):
        pod = pod_dir.name[len(ns) + 1 :]
        if not any(pod.startswith(f"{name}-") for name in real):
            continue
        for path in pod_dir.iterdir():
            if path.is_file() and path.name.endswith(KEPT_SUFFIXES):
                try:
                    (out / pod).mkdir(exist_ok=True)
                    shutil.copy2(path, out / pod / path.name)
                except OSError as e:
                    notes.append(f"{path}: {e}")
    return notes


def summary(out: Path) -> dict[str, Any]:
    """Where the evidence is and what it holds, for the report."""
    return {"folder": str(out), "files": sum(1 for p in out.rglob("*") if p.is_file())}
