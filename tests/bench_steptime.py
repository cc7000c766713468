"""Benchmark: the trainer's step time with the sync sidecar uploading, against the same run
without it, side by side.

Runs the example fine-tuning script (examples/finetune.py) as a local process, alternately
alone and with ``trainingrun sync`` watching its checkpoint folder and committing every
checkpoint to the local SeaweedFS, for ``--rounds`` rounds each. A step's time is the gap
between two consecutive loss lines on the script's stdout; the median over all steps of all
rounds is reported for both, and their ratio. Target: <= 1.05x.

    .venv/bin/python -m tests.bench_steptime [--rounds 3] [--steps 120] [--save-steps 20] \\
        [--write docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from tests import localenv
from tests.bench_transfer import write_section
from tests.integration.agents import S3, SyncProcess, agent_env, wait_committed

REPO = Path(__file__).resolve().parent.parent
SECTION = "## Trainer step time with the sync sidecar"


def step_times(ckdir: Path, steps: int, save_steps: int) -> list[float]:
    """Runs the example to ``steps``; returns the gaps between consecutive loss lines."""
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
    proc.wait(timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"the example exited {proc.returncode}")
    return [b - a for a, b in itertools.pairwise(stamps)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--save-steps", type=int, default=20)
    parser.add_argument("--write", type=Path)
    args = parser.parse_args(argv)
    env = localenv.load() or localenv.up()
    s3 = S3.of(env)
    work = Path(tempfile.mkdtemp(prefix="bench-steptime-"))
    times: dict[str, list[float]] = {"without sync": [], "with sync": []}
    committed = 0
    try:
        for rnd in range(args.rounds):
            order = ["without sync", "with sync"]
            for mode in order if rnd % 2 == 0 else order[::-1]:
                ckdir = work / f"{rnd}-{mode.replace(' ', '-')}" / "ck"
                ckdir.mkdir(parents=True)
                sync = None
                run_key = f"bench-steptime/{uuid.uuid4().hex[:8]}"
                if mode == "with sync":
                    sync = SyncProcess(
                        # The sidecar's own default niceness (10), as in a pod.
                        agent_env(
                            s3, f"s3://{s3.bucket}/{run_key}", ckdir, TRAININGRUN_SYNC_NICE="10"
                        ),
                        work / f"sync-{rnd}.log",
                    )
                try:
                    times[mode] += step_times(ckdir, args.steps, args.save_steps)
                    if sync is not None:
                        wait_committed(s3.client(), s3.bucket, run_key, args.steps, timeout=120)
                finally:
                    if sync is not None:
                        sync.terminate()
                        committed += sync.log().count(" committed: ")
                        sync.close()
                median = statistics.median(times[mode]) * 1000
                print(f"round {rnd + 1} {mode:<13} median step so far {median:.1f} ms", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    plain = statistics.median(times["without sync"])
    synced = statistics.median(times["with sync"])
    ratio = synced / plain
    lines = [
        SECTION,
        "",
        f"Command: `python -m tests.bench_steptime --rounds {args.rounds} --steps {args.steps} "
        f"--save-steps {args.save_steps}`",
        "",
        f"The example fine-tuning script (tiny GPT-2, CPU), {args.steps} steps, a checkpoint every "
        f"{args.save_steps} steps, {args.rounds} rounds alternating the order; with sync, "
        "`trainingrun sync` (nice 10 by default) committed each checkpoint to SeaweedFS on "
        f"loopback ({committed} checkpoints committed in all).",
        "",
        "| run | median step | steps measured |",
        "|---|---:|---:|",
        f"| without sync | {plain * 1000:.1f} ms | {len(times['without sync'])} |",
        f"| with sync | {synced * 1000:.1f} ms | {len(times['with sync'])} |",
        "",
        f"- with sync / without = {ratio:.3f}x: target <= 1.05x "
        f"{'met' if ratio <= 1.05 else 'NOT met'}",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if args.write:
        write_section(args.write, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
