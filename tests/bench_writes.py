"""Benchmark: what one write call's size costs when a checkpoint file lands in the page cache.

The restore writes each block it receives in place (``pwrite``). This writes ``--size-mib`` to a
fresh file on the checkpoint folder's disk, one size of write call at a time, after the machine's
memory has sat idle for ``--idle`` seconds (as it has between two restores; on a virtual machine
that returns freed memory to its host, such memory is faulted in again at first touch), and
reports MiB/s and the system CPU seconds per GiB, medians of alternating rounds. Nothing on the
network: only the writes.

    .venv/bin/python -m tests.bench_writes [--sizes-kib 32,256,512,768,1024,4096] \
        [--rounds 3] [--idle 6] [--dir /tmp] [--write docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

from tests.benchutil import publish
from trainingrun.checkpoint.local import WRITE_BLOCK

SECTION = "## The restore's write size"
KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30


def write_file(folder: Path, total: int, block: int) -> tuple[float, float]:
    """(seconds, system CPU seconds) to write ``total`` bytes, ``block`` per pwrite, into a new
    file in ``folder``; the file is removed afterwards."""
    data = memoryview(os.urandom(block))
    fd, name = tempfile.mkstemp(dir=folder, prefix="bench-writes-")
    try:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_stime
        start = time.perf_counter()
        for offset in range(0, total, block):
            os.pwrite(fd, data[: min(block, total - offset)], offset)
        seconds = time.perf_counter() - start
        system = resource.getrusage(resource.RUSAGE_SELF).ru_stime - before
    finally:
        os.close(fd)
        os.unlink(name)
    return seconds, system


def run(args: argparse.Namespace) -> dict[int, list[tuple[float, float]]]:
    total = args.size_mib * MiB
    samples: dict[int, list[tuple[float, float]]] = {}
    sizes = [k * KiB for k in args.sizes_kib]
    for rnd in range(args.rounds):
        k = rnd % len(sizes)
        for block in sizes[k:] + sizes[:k]:
            os.sync()
            time.sleep(args.idle)
            seconds, system = write_file(args.dir, total, block)
            gib = total / GiB
            samples.setdefault(block, []).append((total / MiB / seconds, system / gib))
            print(
                f"round {rnd + 1} writes of {block // KiB:5d} KiB: {total / MiB / seconds:6.0f} "
                f"MiB/s, {system / gib:5.2f} system CPU s/GiB",
                flush=True,
            )
    return samples


def report(samples: dict[int, list[tuple[float, float]]], args: argparse.Namespace) -> str:
    command = (
        f"python -m tests.bench_writes --sizes-kib {','.join(map(str, args.sizes_kib))} "
        f"--rounds {args.rounds} --idle {args.idle:g} --size-mib {args.size_mib}"
    )
    lines = [
        SECTION,
        "",
        f"Command: `{command}`",
        "",
        f"{args.size_mib} MiB written to a new file in {args.dir} ({os.uname().release}), one "
        f"size of `pwrite` at a time, each after {args.idle:g} s of idle memory; medians of "
        f"{args.rounds} alternating round(s). The restore writes "
        f"{WRITE_BLOCK // KiB} KiB at a time.",
        "",
        "| write size | MiB/s | system CPU s/GiB | each round's MiB/s |",
        "|---:|---:|---:|---|",
    ]
    for block in sorted(samples):
        got = samples[block]
        lines.append(
            f"| {block // KiB} KiB | {statistics.median(r for r, _ in got):.0f} | "
            f"{statistics.median(c for _, c in got):.2f} | "
            f"{', '.join(f'{r:.0f}' for r, _ in got)} |"
        )
    return "\n".join(lines) + "\n"


def size_list(text: str) -> list[int]:
    try:
        sizes = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: comma-separated KiB, e.g. 512,1024") from None
    if not sizes or min(sizes) < 4:
        raise argparse.ArgumentTypeError(f"{text!r}: sizes of at least 4 KiB")
    return sizes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes-kib", type=size_list, default=[32, 256, 512, 768, 1024, 4096])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--idle", type=float, default=6.0, help="seconds before each write")
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--write", type=Path, help="update this markdown file's section")
    args = parser.parse_args(argv)
    text = report(run(args), args)
    publish("writes", text, args.write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
