"""The HuggingFace Trainer integration with real training processes (no cluster): a run stopped
by SIGTERM, or by the sidecar's save-now request, saves at the next step end, marks the
checkpoint complete and exits 143; resumed from that checkpoint (``TRAININGRUN_RESUME_FROM``, or
``resume_from_checkpoint=True`` finding it in the output folder) it ends with weights bitwise
equal to an uninterrupted run, and the same loss at every step after the resume point."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.support import wait_for
from trainingrun import local

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "examples" / "finetune.py"
MAX_STEPS, SAVE_STEPS = 40, 10
EXIT_STOPPED = 143


def losses(path: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in map(json.loads, path.read_text().splitlines())}


def start(ckdir: Path, loss_log: Path, delay: float = 0.0, **env: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            str(SCRIPT),
            f"--max-steps={MAX_STEPS}",
            f"--save-steps={SAVE_STEPS}",
            f"--loss-log={loss_log}",
            f"--step-delay={delay}",
        ],
        env={**os.environ, "TRAININGRUN_CHECKPOINT_DIR": str(ckdir), **env},
        cwd=ckdir.parent,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, dict[int, float]]:
    work = tmp_path_factory.mktemp("uninterrupted")
    proc = start(work / "ck", work / "loss.jsonl")
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err.decode()[-2000:]
    final = work / "ck" / f"checkpoint-{MAX_STEPS}"
    assert (final / local.COMPLETE_MARKER).exists()
    return (final / "model.safetensors").read_bytes(), losses(work / "loss.jsonl")


def stop_at(proc: subprocess.Popen[bytes], ckdir: Path, step: int, how: str) -> None:
    def reached() -> bool:
        progress = local.read_progress(ckdir)
        return progress is not None and progress.step >= step

    wait_for(reached, 120, f"step {step}")
    if how == "sigterm":
        proc.send_signal(signal.SIGTERM)
    else:
        local.request_save(ckdir, "preemption notice: test")


@pytest.mark.parametrize(
    ("how", "resume"),
    [("sigterm", "env"), ("save-now", "output-dir")],
    ids=["sigterm-resume-from-env", "save-now-resume-from-output-dir"],
)
def test_stop_saves_next_step_and_resume_is_exact(
    tmp_path: Path, uninterrupted: tuple[bytes, dict[int, float]], how: str, resume: str
) -> None:
    weights, reference = uninterrupted
    stop_step = random.Random(f"{how}-{resume}").randint(12, 27)  # never on a save step
    if stop_step % SAVE_STEPS == 0:
        stop_step += 1
    ckdir, first_log = tmp_path / "ck", tmp_path / "loss-1.jsonl"
    proc = start(ckdir, first_log, delay=0.3)
    stop_at(proc, ckdir, stop_step, how)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == EXIT_STOPPED, err.decode()[-2000:]
    saved = max(s for p in ckdir.iterdir() if (s := local.checkpoint_step(p.name)) is not None)
    assert stop_step <= saved <= stop_step + 2, f"stopped at {stop_step}, saved {saved}"
    assert (ckdir / f"checkpoint-{saved}" / local.COMPLETE_MARKER).exists()
    print(f"{how}: stop requested at step {stop_step}, saved checkpoint-{saved}")

    # The next attempt: a fresh process resuming from the saved checkpoint.
    (ckdir / local.CONTROL_DIR / local.SAVE_NOW).unlink(missing_ok=True)
    second_log = tmp_path / "loss-2.jsonl"
    env = {"TRAININGRUN_RESUME_FROM": str(ckdir / f"checkpoint-{saved}")} if resume == "env" else {}
    if resume == "output-dir":
        env["RESUME_FROM_OUTPUT_DIR"] = "1"
    proc = start(ckdir, second_log, **env)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err.decode()[-2000:]
    final = ckdir / f"checkpoint-{MAX_STEPS}" / "model.safetensors"
    assert final.read_bytes() == weights
    after = losses(second_log)
    assert sorted(after) == list(range(saved + 1, MAX_STEPS + 1))
    assert all(after[s] == reference[s] for s in after), "loss differs after the resume point"
    before = losses(first_log)
    assert all(before[s] == reference[s] for s in before if s <= saved)


def test_saving_is_quick_to_start(tmp_path: Path) -> None:
    """The stop request is honoured at the next step end, not at the next save step."""
    ckdir = tmp_path / "ck"
    proc = start(ckdir, tmp_path / "loss.jsonl", delay=0.5)
    stop_at(proc, ckdir, 3, "sigterm")
    sent = time.monotonic()
    proc.communicate(timeout=120)
    assert proc.returncode == EXIT_STOPPED
    assert time.monotonic() - sent < 30
    assert [p.name for p in ckdir.iterdir() if p.name.startswith("checkpoint-")] in (
        ["checkpoint-3"],
        ["checkpoint-4"],
    )
