"""The user commands against a live run: ``trainingrun checkpoints list`` shows the committed
checkpoints newest first with size, time and whether their objects are all there, and
``trainingrun status`` shows phase, budgets, the latest checkpoint and conditions; both also
run as the ``kubectl trainingrun`` plugin; output into a closed pipe ends quietly. An unknown
run gives a one-line error and exit 1."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.integration.support import Runs, commit_checkpoint, trainingrun
from tests.localenv import LocalEnv

pytestmark = pytest.mark.usefixtures("operator")
BIN = Path(sys.executable).parent


def cli(localenv: LocalEnv, *args: str, plugin: bool = False) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KUBECONFIG": localenv.kubeconfig, "PATH": f"{BIN}:{localenv.bin_dir}"}
    if plugin:  # kubectl finds kubectl-trainingrun on PATH
        command = [str(Path(localenv.bin_dir) / "kubectl"), "trainingrun", *args]
    else:
        command = [str(BIN / "trainingrun"), *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=60, check=False)


def test_checkpoints_list_and_status_of_a_live_run(
    runs: Runs, localenv: LocalEnv, prefix: str, kwok_node: Any, s3: Any
) -> None:
    key = f"{prefix}/{runs.namespace}/cli"
    commit_checkpoint(s3, localenv.bucket, key, 10, {"model.safetensors": b"w" * 3000})
    # Its upload took longer than the 120 s grace period: a save on preemption would be lost.
    files = {"model.safetensors": b"v" * 5000, "x": b"1"}
    commit_checkpoint(s3, localenv.bucket, key, 20, files, upload_seconds=150.0)
    # Committed before the run exists: its first attempt resumes from step 20.
    runs.create(trainingrun("cli", localenv, prefix, node=kwok_node()))
    status = runs.wait_status(
        "cli",
        lambda s: (
            s.get("activePod") == "cli-1"
            and (s.get("latestCheckpoint") or {}).get("step") == 20
            and "saveEstimate" in s
        ),
        60,
        "attempt 1 started from step 20, its save estimated",
    )
    risk = next(c for c in status["conditions"] if c["type"] == "SaveAtRisk")
    assert (risk["status"], risk["reason"]) == ("True", "SaveTooSlow")
    assert status["saveEstimate"]["fits"] is False
    assert status["saveEstimate"]["windowSeconds"] == 120
    (warned,) = runs.wait_events("cli", "SaveTooSlow")
    assert warned.type == "Warning" and "terminationGracePeriodSeconds" in warned.message
    s3.delete_object(Bucket=localenv.bucket, Key=f"{key}/checkpoints/checkpoint-20/x")

    for plugin in (False, True):
        out = cli(localenv, "checkpoints", "list", "cli", "-n", runs.namespace, plugin=plugin)
        assert out.returncode == 0, out.stderr
        header, *rows = out.stdout.strip().splitlines()
        assert header.split() == ["STEP", "SIZE", "COMMITTED", "FILES", "VERIFIED"]
        assert [r.split()[0] for r in rows] == ["20", "10"]
        assert "no: x is missing" in rows[0]
        assert rows[1].split()[-1] == "yes"
        assert "2.9 KiB" in rows[1]

    out = cli(localenv, "status", "cli", "-n", runs.namespace)
    assert out.returncode == 0, out.stderr
    fields = dict(
        (k.strip(), v.strip())
        for k, _, v in (line.partition(":") for line in out.stdout.splitlines())
    )
    assert fields["Phase"] == "Running"
    assert fields["Attempt"] == "1"
    assert fields["Active pod"] == "cli-1"
    assert fields["Latest checkpoint"].startswith("step 20, format hf (")
    assert fields["Save estimate"].startswith("150 s to upload, DOES NOT FIT the 120 s a save has")
    assert "Conditions" in fields

    # Piped into a reader that already went away (`| head -1` after its line): no traceback.
    read_end, write_end = os.pipe()
    os.close(read_end)
    env = {**os.environ, "KUBECONFIG": localenv.kubeconfig}
    closed = subprocess.run(
        [str(BIN / "trainingrun"), "status", "cli", "-n", runs.namespace],
        env=env,
        stdout=write_end,
        stderr=subprocess.PIPE,
        text=True,
        timeout=60,
        check=False,
    )
    os.close(write_end)
    assert (closed.returncode, closed.stderr) == (0, "")


def test_unknown_run_is_one_clear_line(localenv: LocalEnv, namespace: str) -> None:
    out = cli(localenv, "status", "nope", "-n", namespace)
    assert out.returncode == 1
    assert out.stderr.strip() == (
        f"trainingrun: TrainingRun {namespace}/nope not found "
        f"(kubectl get trainingruns -n {namespace})"
    )
