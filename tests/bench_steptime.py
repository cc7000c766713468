"""Benchmark: the trainer's step time with the sync sidecar uploading, against the same run
without it, side by side.

Runs the example fine-tuning script (examples/finetune.py) as a local process, in each round
alone, with ``trainingrun sync`` watching its checkpoint folder and committing every checkpoint
to the local SeaweedFS, and the same with SeaweedFS reniced to the sidecar's niceness (in a pod
the store is another machine; here it shares the trainer's two cores), the order rotating from
round to round. A step's time is the gap between two consecutive loss lines on the script's
stdout; the median over all steps of all rounds is reported for each, and their ratios to the
run alone. The CPU seconds of the trainer, the sidecar and SeaweedFS per round show where the
difference goes. Target: <= 1.05x.

    .venv/bin/python -m tests.bench_steptime [--rounds 3] [--steps 120] [--save-steps 20] \\
        [--write docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from tests import localenv
from tests.benchutil import cpu_seconds, publish
from tests.integration.agents import S3, SyncProcess, agent_env, wait_committed

REPO = Path(__file__).resolve().parent.parent
SECTION = "## Trainer step time with the sync sidecar"
SYNC_NICE = 10  # trainingrun sync's default (TRAININGRUN_SYNC_NICE)


ALONE, SYNC, SYNC_STORE_NICED = "without sync", "with sync", "with sync, store niced"
MODES = [ALONE, SYNC, SYNC_STORE_NICED]


def renice(pid: int, nice: int) -> None:
    """Sets the niceness of every thread of the process (Linux niceness is per thread; threads
    created later inherit it from their creator)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(ProcessLookupError):
            os.setpriority(os.PRIO_PROCESS, int(task.name), nice)


def step_times(ckdir: Path, steps: int, save_steps: int) -> tuple[list[float], float]:
    """Runs the example to ``steps``; returns the gaps between consecutive loss lines and the
    trainer's CPU seconds."""
    proc = subprocess.Popen(
        [
            sys.executable,
            str(REPO / "examples" / "finetune.py"),
            f"--max-steps={steps}",
            f"--save-steps={save_steps}",
            "--loss-log=-",
        ],
        env={**os.environ, "TRAININGRUN_CHECKPOINT_DIR": str(ckdir)},
        cwd=ckdir.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    stamps = []
    for line in proc.stdout:
        if line.startswith('{"step"'):
            stamps.append(time.perf_counter())
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"the example exited {proc.returncode}")
    return [b - a for a, b in itertools.pairwise(stamps)], usage.ru_utime + usage.ru_stime


def stop_sync(sync: SyncProcess) -> float:
    """SIGTERM (the sidecar drains and exits); returns its CPU seconds."""
    sync.proc.send_signal(signal.SIGTERM)
    _, status, usage = os.wait4(sync.proc.pid, 0)
    sync.proc.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_utime + usage.ru_stime


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--save-steps", type=int, default=20)
    parser.add_argument("--write", type=Path)
    args = parser.parse_args(argv)
    env = localenv.load() or localenv.up()
    s3 = S3.of(env)
    store_pid, store_nice = env.seaweedfs_pid, os.getpriority(os.PRIO_PROCESS, env.seaweedfs_pid)
    work = Path(tempfile.mkdtemp(prefix="bench-steptime-"))
    times: dict[str, list[float]] = {m: [] for m in MODES}
    cpu: dict[str, dict[str, float]] = {
        m: {"trainer": 0.0, "sync": 0.0, "store": 0.0} for m in MODES
    }
    committed = 0
    try:
        for rnd in range(args.rounds):
            for mode in MODES[rnd % 3 :] + MODES[: rnd % 3]:
                ckdir = work / f"{rnd}-{MODES.index(mode)}" / "ck"
                ckdir.mkdir(parents=True)
                sync = None
                run_key = f"bench-steptime/{uuid.uuid4().hex[:8]}"
                renice(store_pid, SYNC_NICE if mode == SYNC_STORE_NICED else store_nice)
                if mode != ALONE:
                    sync = SyncProcess(
                        # The sidecar's own default niceness, as in a pod.
                        agent_env(
                            s3,
                            f"s3://{s3.bucket}/{run_key}",
                            ckdir,
                            TRAININGRUN_SYNC_NICE=str(SYNC_NICE),
                        ),
                        work / f"sync-{rnd}-{MODES.index(mode)}.log",
                    )
                store_before = cpu_seconds(store_pid, children=True)
                try:
                    steps, trainer_cpu = step_times(ckdir, args.steps, args.save_steps)
                    times[mode] += steps
                    cpu[mode]["trainer"] += trainer_cpu
                    if sync is not None:
                        wait_committed(s3.client(), s3.bucket, run_key, args.steps, timeout=120)
                finally:
                    if sync is not None:
                        cpu[mode]["sync"] += stop_sync(sync)
                        committed += sync.log().count(" committed: ")
                        sync.close()
                    cpu[mode]["store"] += cpu_seconds(store_pid, children=True) - store_before
                median = statistics.median(times[mode]) * 1000
                print(f"round {rnd + 1} {mode:<23} median step so far {median:.1f} ms", flush=True)
    finally:
        renice(store_pid, store_nice)
        shutil.rmtree(work, ignore_errors=True)
    medians = {m: statistics.median(times[m]) for m in MODES}
    rows = [
        f"| {m} | {medians[m] * 1000:.1f} ms | {medians[m] / medians[ALONE]:.3f}x | "
        + " | ".join(f"{cpu[m][k] / args.rounds:.1f} s" for k in ("trainer", "sync", "store"))
        + f" | {len(times[m])} |"
        for m in MODES
    ]
    ratio, ratio_niced = (medians[m] / medians[ALONE] for m in (SYNC, SYNC_STORE_NICED))
    lines = [
        SECTION,
        "",
        f"Command: `python -m tests.bench_steptime --rounds {args.rounds} --steps {args.steps} "
        f"--save-steps {args.save_steps}`",
        "",
        f"The example fine-tuning script (tiny GPT-2, CPU), {args.steps} steps, a checkpoint every "
        f"{args.save_steps} steps, {args.rounds} rounds rotating the order; with sync, "
        f"`trainingrun sync` (nice {SYNC_NICE}, its default) committed each checkpoint to "
        f'SeaweedFS on loopback ({committed} checkpoints committed in all). "store niced": '
        f"SeaweedFS at nice {SYNC_NICE} too, standing in for a store on another machine. CPU "
        "seconds are per round.",
        "",
        "| run | median step | vs alone | trainer CPU | sync CPU | SeaweedFS CPU | steps |",
        "|---|---:|---:|---:|---:|---:|---:|",
        *rows,
        "",
        f"- with sync / without = {ratio:.3f}x: target <= 1.05x "
        f"{'met' if ratio <= 1.05 else 'NOT met'}",
        f"- with sync, the local store niced / without = {ratio_niced:.3f}x",
        "",
    ]
    text = "\n".join(lines)
    publish("steptime", text, args.write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
