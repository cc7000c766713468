"""trainingrun.integrations.hf under torch.distributed: a real 2-process gloo group on CPU (spawned
processes,
``tcp://127.0.0.1:<free port>``, bounded waits), each process driving its own callback through
the events the Trainer sends, no training. Covers: one rank's SIGTERM or save-now request makes
both ranks save and stop at the same step (the other one with ``PEER_STOP``), both exit 143;
each node's folder is marked complete after a save, once the files of every process of the node
are there (two processes sharing one folder: the marker waits for the later one's file); a node
whose folder the save did not create gets no marker; progress only from world process zero.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import socket
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist
from transformers import TrainerControl, TrainerState, TrainingArguments

from trainingrun.checkpoint import local
from trainingrun.integrations import hf

WORLD = 2
MAX_STEPS, SAVE_STEPS = 12, 5
JOIN_TIMEOUT = 120  # seconds for a whole scenario, imports included
NOTICE = "preemption notice: test"
LATE_WRITE = 0.5  # seconds a late process waits before writing its file


@dataclass(frozen=True)
class Scenario:
    """What each rank does; rank r writes into ``node<r>/``, or ``node0/`` when ``one_node``."""

    flagged_rank: int | None = None
    how: str = ""  # "sigterm" or "save-now", during step ``flag_at``
    flag_at: int = 7
    one_node: bool = False  # both processes on one node: one folder, rank 1 not local zero
    late_rank: int | None = None  # writes its rng state LATE_WRITE seconds after the others
    writes_nothing: int | None = None  # a rank whose save creates no folder (save_only_model)

    def folder(self, root: Path, rank: int) -> Path:
        return root / f"node{0 if self.one_node else rank}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def trainer_state(rank: int, step: int, scenario: Scenario) -> TrainerState:
    s = TrainerState(global_step=step, max_steps=MAX_STEPS)
    s.is_world_process_zero = rank == 0
    s.is_local_process_zero = rank == 0 or not scenario.one_node
    return s


def save(rank: int, checkpoint: Path, scenario: Scenario) -> None:
    """What Trainer._save_checkpoint writes with its defaults: process zero the model and the
    trainer state, every process its rng_state_<rank>.pth (creating the folder if need be)."""
    if rank == scenario.writes_nothing:
        return
    if rank == scenario.late_rank:
        time.sleep(LATE_WRITE)
    checkpoint.mkdir(parents=True, exist_ok=True)
    if rank == 0:
        (checkpoint / "model.safetensors").write_bytes(b"weights")
    (checkpoint / f"rng_state_{rank}.pth").write_bytes(b"rng")
    if rank == 0:
        (checkpoint / local.TRAINER_STATE).write_text("{}")


def drive(rank: int, root: Path, scenario: Scenario) -> dict[str, Any]:
    """The Trainer's loop as the callback sees it: step ends, saves, the end of training."""
    folder = scenario.folder(root, rank)
    args = TrainingArguments(output_dir=str(folder), report_to=[], use_cpu=True)
    callback = hf.TrainingRunCallback(folder)
    control = TrainerControl()
    callback.on_train_begin(args, trainer_state(rank, 0, scenario), control)
    step, saved, seen_after_save = 0, [], {}
    while step < MAX_STEPS and not control.should_training_stop:
        step += 1
        if rank == scenario.flagged_rank and step == scenario.flag_at:
            if scenario.how == "sigterm":
                signal.raise_signal(signal.SIGTERM)
            else:
                local.request_save(folder, NOTICE)
        control = TrainerControl(should_save=step % SAVE_STEPS == 0)  # DefaultFlowCallback's
        control = callback.on_step_end(args, trainer_state(rank, step, scenario), control)
        if control.should_save:
            checkpoint = folder / f"checkpoint-{step}"
            save(rank, checkpoint, scenario)
            callback.on_save(args, trainer_state(rank, step, scenario), control)
            saved.append(step)
            seen_after_save[step] = sorted(p.name for p in checkpoint.glob("*"))
            seen_after_save[step] += sorted(p.name for p in checkpoint.glob(".*"))
    callback.on_train_end(args, trainer_state(rank, step, scenario), control)
    return {
        "stop_reason": callback.stop_reason,
        "last_step": step,
        "saved": saved,
        "seen_after_save": seen_after_save,
        "exit_code": callback.exit_code,
    }


def rank_main(rank: int, port: int, root: str, scenario: Scenario) -> None:
    """One process of the group: its result, or its traceback, goes to ``result-<rank>.json``."""
    out = Path(root) / f"result-{rank}.json"
    try:
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=WORLD,
            timeout=timedelta(seconds=60),
        )
        try:
            out.write_text(json.dumps(drive(rank, Path(root), scenario)))
            dist.barrier()
        finally:
            dist.destroy_process_group()
    except BaseException:
        out.write_text(json.dumps({"error": traceback.format_exc()}))
        raise
    # The result is written and the group left: skip interpreter finalisation, where gloo's
    # worker threads can still hold tensors and abort the process (SIGABRT, "terminate called
    # without an active exception"; pytorch/pytorch#179291 describes the teardown race).
    os._exit(0)


def run_group(root: Path, scenario: Scenario) -> list[dict[str, Any]]:
    """Runs ``scenario`` on a fresh 2-process gloo group; each rank's result."""
    ctx = multiprocessing.get_context("spawn")
    port = free_port()
    procs = [
        ctx.Process(target=rank_main, args=(rank, port, str(root), scenario), daemon=True)
        for rank in range(WORLD)
    ]
    for p in procs:
        p.start()
    deadline = time.monotonic() + JOIN_TIMEOUT
    for p in procs:
        p.join(max(0.1, deadline - time.monotonic()))
    hung = [p.pid for p in procs if p.is_alive()]
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(10)
    results = []
    for rank in range(WORLD):
        path = root / f"result-{rank}.json"
        results.append(json.loads(path.read_text()) if path.exists() else {"error": "none"})
    errors = [r["error"] for r in results if "error" in r]
    assert not hung and not errors, f"hung: {hung}; errors: {errors}"
    assert [p.exitcode for p in procs] == [0, 0]
    return results


def marked(folder: Path) -> list[int]:
    return [c.step for c in local.scan(folder) if c.marked]


@pytest.mark.parametrize(
    ("flagged_rank", "how", "reason"),
    [(1, "sigterm", "SIGTERM"), (0, "sigterm", "SIGTERM"), (1, "save-now", NOTICE)],
    ids=["sigterm-on-rank-1", "sigterm-on-rank-0", "save-now-on-rank-1"],
)
def test_one_rank_asked_both_save_and_stop_at_the_same_step(
    tmp_path: Path, flagged_rank: int, how: str, reason: str
) -> None:
    scenario = Scenario(flagged_rank=flagged_rank, how=how, flag_at=7)
    results = run_group(tmp_path, scenario)
    other = 1 - flagged_rank
    assert results[flagged_rank]["stop_reason"] == reason
    assert results[other]["stop_reason"] == hf.PEER_STOP
    for r in results:
        assert (r["last_step"], r["saved"], r["exit_code"]) == (7, [5, 7], hf.EXIT_STOPPED)
    # Both nodes' folders marked, each holding its own part: node 1 only its rng state.
    assert marked(tmp_path / "node0") == marked(tmp_path / "node1") == [5, 7]
    node1 = {p.name for p in (tmp_path / "node1" / "checkpoint-7").iterdir()}
    assert node1 == {"rng_state_1.pth", local.COMPLETE_MARKER}
    # Progress from world process zero only.
    progress = local.read_progress(tmp_path / "node0")
    assert progress is not None and (progress.step, progress.max_steps) == (7, MAX_STEPS)
    assert local.read_progress(tmp_path / "node1") is None


def test_nobody_asked_both_run_to_the_end(tmp_path: Path) -> None:
    results = run_group(tmp_path, Scenario())
    for r in results:
        assert (r["stop_reason"], r["last_step"], r["saved"], r["exit_code"]) == (
            None,
            MAX_STEPS,
            [5, 10],
            0,
        )
    assert marked(tmp_path / "node0") == marked(tmp_path / "node1") == [5, 10]


@pytest.mark.parametrize(
    ("scenario", "expected"),
    [
        (
            Scenario(one_node=True, late_rank=1),
            {
                "node0": {
                    "model.safetensors",
                    "rng_state_0.pth",
                    "rng_state_1.pth",
                    local.TRAINER_STATE,
                    local.COMPLETE_MARKER,
                }
            },
        ),
        (
            Scenario(writes_nothing=1),
            {
                "node0": {
                    "model.safetensors",
                    "rng_state_0.pth",
                    local.TRAINER_STATE,
                    local.COMPLETE_MARKER,
                }
            },
        ),
    ],
    ids=["two-processes-one-node-late-peer", "node-folder-not-created"],
)
def test_marker_follows_every_file_of_the_node(
    tmp_path: Path, scenario: Scenario, expected: dict[str, set[str]]
) -> None:
    results = run_group(tmp_path, scenario)
    for node, files in expected.items():
        assert {p.name for p in (tmp_path / node / "checkpoint-5").iterdir()} == files
    # What the local process zero saw right after on_save: its marker, and every file of its
    # node's processes, the late one's too (the barrier).
    assert set(results[0]["seen_after_save"]["5"]) == expected["node0"]
    if not scenario.one_node:
        assert not (tmp_path / "node1").exists()  # neither the save nor the marker made it
