"""Benchmark: the commit protocol's cost on sync and restore, version 1 against version 2, side by
side in one run.

Version 1 is the ``operator/`` folder of a git revision (``git archive``, default 01b44ab), version
2 the working tree's. Each measurement is one child process whose PYTHONPATH is that version's
``operator/``; the child times only the work, never its start or imports, so both versions pay
the same:

- upload: ``Sync.upload_checkpoint`` of a sidecar started beforehand (``Sync.start``), into a run
  that already holds ``keep`` committed checkpoints, so that every commit is a steady-state one:
  retention drops the oldest entry and deletes its objects;
- restore: ``trainingrun.agent.restore.restore`` of the step that version just committed.

Two checkpoints: a large one shaped like a HuggingFace Trainer's (``bench_transfer.shape``), and a
small one (20 files of 1 MiB) where the per-checkpoint requests of the protocol (the manifest
reads, the part record, the sweep's listing) weigh most; a small measurement moves several
checkpoints in a row and reports the time per checkpoint. Each version restores right after its
own upload; rounds alternate the versions (v1 then v2, the next round v2 then v1) so the shared
machine's noise falls on both. Before each measurement the S3 server is allowed to go idle.

Reported per version: the median MiB/s over the rounds and the run-to-run noise (min..max, and
the spread (max - min) as a % of the median); then v2/v1 of the medians, v2/v1 of the same round
(paired), and whether v2 is within v1's noise (v2/v1 >= 1 - v1's spread). The S3 calls each
checkpoint costs are counted too (botocore's before-call events, during the timed work only).

    .venv/bin/python -m tests.bench_protocol [--rev 01b44ab] [--size-gib 1] [--rounds 5] \
        [--small-files 20] [--small-repeats 10] [--write docs/benchmarks.md]

Uses the local environment's SeaweedFS (``make cluster``), starting it when it is not up.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The child imports this module with PYTHONPATH at one version's operator/: only names both
# versions have, and nothing of tests/ that imports trainingrun (see run()).
import trainingrun
from tests import localenv
from tests.benchutil import cpu_seconds, publish
from trainingrun.agent.restore import RestoreSettings, restore
from trainingrun.agent.sync import Sync, SyncSettings
from trainingrun.agent.transfer import MiB, TransferSettings
from trainingrun.checkpoint.local import scan
from trainingrun.storage.opener import (
    Credentials,
    Location,
    S3Store,
    StorageError,
    Store,
    make_client,
)

REPO = Path(__file__).resolve().parent.parent
SECTION = "## Commit protocol v1 against v2: sync and restore"
KEEP = 3  # the sidecar's default retention: the run holds this many committed checkpoints
FIRST_STEP = 100  # timed steps start here; the seed commits are steps 1..KEEP
CHILD_TIMEOUT_S = 1800  # one child moves at most a few GiB; a hung endpoint must not hang us
VERSIONS = ("v1", "v2")
# Before each measurement: the S3 server counts as idle below 5% of a core over 0.5 s.
SETTLE_IDLE, SETTLE_SAMPLE_S, SETTLE_MAX_S = 0.05, 0.5, 30.0


# ---------------------------------------------------------------------------------------------
# The child: one version's code, one measurement


class CallCounter:
    """S3 API calls by operation name while ``counting`` (retries of one call count once)."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.counting = False
        self._lock = threading.Lock()

    def __call__(self, event_name: str, **kwargs: Any) -> None:
        if self.counting:
            with self._lock:
                self.calls[event_name.rsplit(".", 1)[-1]] += 1


def cpu_now() -> float:
    """This process's CPU seconds, all threads, user + system."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    return me.ru_utime + me.ru_stime


class Timer:
    """Sums wall and CPU seconds over the timed sections, with the S3 calls made in them."""

    def __init__(self, counter: CallCounter) -> None:
        self.counter = counter
        self.seconds: list[float] = []
        self.cpu = 0.0

    def __enter__(self) -> Timer:
        self.counter.counting = True
        self._cpu, self._wall = cpu_now(), time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds.append(time.perf_counter() - self._wall)
        self.cpu += cpu_now() - self._cpu
        self.counter.counting = False


def child_store(s3: dict[str, str]) -> tuple[Store, CallCounter]:
    concurrency = TransferSettings().concurrency
    client = make_client(
        s3["endpoint"],
        s3["region"],
        Credentials(s3["access_key"], s3["secret_key"]),
        2 * concurrency + 4,
    )
    counter = CallCounter()
    client.meta.events.register("before-call.s3", counter)
    return S3Store(client, s3["bucket"]), counter


def child_upload(spec: dict[str, Any], store: Store, timer: Timer) -> None:
    """Uploads the one checkpoint folder of ``spec["dir"]`` as each of ``spec["steps"]`` in turn
    (renamed between them, untimed) with one sidecar, as a running sidecar does."""
    folder = Path(spec["dir"])
    sync = Sync(
        store,
        SyncSettings(checkpoint_dir=folder, run=Location(store.bucket, spec["prefix"]), keep=KEEP),
    )
    sync.start()
    try:
        for step in spec["steps"]:
            (current,) = folder.glob("checkpoint-*")
            current.rename(folder / f"checkpoint-{step}")
            (found,) = [c for c in scan(folder) if c.step == step]
            with timer:
                sync.upload_checkpoint(found)
    finally:
        sync.transfer.close()


def child_restore(spec: dict[str, Any], store: Store, timer: Timer) -> None:
    """Restores step ``spec["step"]`` ``spec["times"]`` times into fresh folders (each removed
    after, untimed)."""
    run = Location(store.bucket, spec["prefix"])
    for i in range(spec["times"]):
        dest = Path(spec["dest"]) / f"restore-{i}"
        with timer:
            restore(store, RestoreSettings(checkpoint_dir=dest, run=run, step=spec["step"]))
        shutil.rmtree(dest)


def child_main() -> int:
    """Reads the measurement's spec (JSON) on stdin; prints the result as one JSON line."""
    spec = json.loads(sys.stdin.read())
    store, counter = child_store(spec["s3"])
    timer = Timer(counter)
    {"upload": child_upload, "restore": child_restore}[spec["mode"]](spec, store, timer)
    result = {
        "seconds": timer.seconds,
        "cpu": timer.cpu,
        "calls": dict(counter.calls),
        "code": str(Path(trainingrun.__file__).resolve().parent.parent),
    }
    print(json.dumps(result))
    return 0


# ---------------------------------------------------------------------------------------------
# The parent: the versions, the rounds, the report


@dataclass(frozen=True)
class Case:
    name: str
    title: str
    sizes: dict[str, int]
    repeats: int  # checkpoints per measurement


@dataclass
class Measure:
    """One child's measurement, per checkpoint."""

    seconds: float
    cpu: float
    calls: dict[str, float]
    settled: float  # seconds waited for the S3 server to go idle before it (untimed)


@dataclass
class Series:
    """The measurements of one (case, operation, version), one per round."""

    bytes: int
    rounds: list[Measure] = field(default_factory=list)

    def rates(self) -> list[float]:
        return [self.bytes / MiB / m.seconds for m in self.rounds]


class Runner:
    def __init__(
        self, s3: dict[str, str], server_pid: int, code: dict[str, Path], work: Path
    ) -> None:
        self.s3 = s3
        self.server_pid = server_pid
        self.code = code
        self.work = work

    def settle(self) -> float:
        """Waits (at most SETTLE_MAX_S) until the previous measurement's aftermath is over, so
        that it does not land on the next one: its writes on disk, the S3 server idle. Returns
        the seconds waited."""
        started = time.monotonic()
        os.sync()
        for _ in range(int(SETTLE_MAX_S / SETTLE_SAMPLE_S)):
            before = cpu_seconds(self.server_pid)
            time.sleep(SETTLE_SAMPLE_S)
            if cpu_seconds(self.server_pid) - before < SETTLE_IDLE * SETTLE_SAMPLE_S:
                break
        return time.monotonic() - started

    def child(self, version: str, spec: dict[str, Any]) -> Measure:
        settled = self.settle()
        env = {**os.environ, "PYTHONPATH": str(self.code[version])}
        proc = subprocess.run(
            [sys.executable, "-m", "tests.bench_protocol", "--child"],
            input=json.dumps({**spec, "s3": self.s3}),
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=CHILD_TIMEOUT_S,
            check=False,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"{version} {spec['mode']} failed:\n{proc.stderr[-4000:]}")
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        if Path(out["code"]) != self.code[version].resolve():
            raise RuntimeError(f"{version}: the child ran the code in {out['code']}")
        n = max(len(out["seconds"]), 1)
        return Measure(
            seconds=sum(out["seconds"]) / n,
            cpu=out["cpu"] / n,
            calls={k: v / n for k, v in out["calls"].items()},
            settled=settled,
        )

    def upload(self, version: str, prefix: str, folder: Path, steps: list[int]) -> Measure:
        spec = {"mode": "upload", "prefix": prefix, "dir": str(folder), "steps": steps}
        return self.child(version, spec)

    def restore(self, version: str, prefix: str, step: int, times: int) -> Measure:
        dest = self.work / f"restore-{version}"
        spec = {"mode": "restore", "prefix": prefix, "step": step, "times": times}
        return self.child(version, {**spec, "dest": str(dest)})


def extract(rev: str, into: Path) -> Path:
    """``git archive <rev> operator | tar -x``: the revision's package, read-only for git."""
    archive = subprocess.run(
        ["git", "archive", rev, "operator"], cwd=REPO, capture_output=True, check=True, timeout=60
    ).stdout
    into.mkdir(parents=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True, timeout=60)
    return into / "operator"


def git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=REPO, capture_output=True, text=True, check=True, timeout=60
    ).stdout.strip()


def cases(args: argparse.Namespace) -> list[Case]:
    # Imported here, not at the top: they import the working tree's trainingrun through
    # tests.integration, which the v1 child must not.
    from tests.bench_transfer import shape  # noqa: PLC0415

    small = {f"shard-{i:02d}.bin": MiB for i in range(args.small_files)}
    return [
        Case("large", f"{args.size_gib:g} GiB, HF-like", shape(args.size_gib), 1),
        Case("small", f"{args.small_files} files of 1 MiB", small, args.small_repeats),
    ]


def run(args: argparse.Namespace) -> dict[str, Any]:
    from tests.integration.agents import S3, make_checkpoint  # noqa: PLC0415 (see cases())

    env = localenv.load() or localenv.up()
    s3 = S3.of(env)
    work = Path(tempfile.mkdtemp(prefix="bench-protocol-"))
    base = f"bench-protocol/{uuid.uuid4().hex[:8]}"
    store = S3Store(
        make_client(s3.endpoint, s3.region, Credentials(s3.access_key, s3.secret_key)), s3.bucket
    )
    load_start = os.getloadavg()[0]
    try:
        code = {"v1": extract(args.rev, work / "v1"), "v2": REPO / "operator"}
        runner = Runner(
            {
                "endpoint": s3.endpoint,
                "region": s3.region,
                "access_key": s3.access_key,
                "secret_key": s3.secret_key,
                "bucket": s3.bucket,
            },
            env.seaweedfs_pid,
            code,
            work,
        )
        todo = cases(args)
        folders: dict[str, Path] = {}
        for case in todo:
            print(f"writing the {case.name} checkpoint ({case.title}) ...", flush=True)
            folders[case.name] = work / case.name
            make_checkpoint(folders[case.name], FIRST_STEP, case.sizes)
        seed = work / "seed"
        make_checkpoint(seed, 1, {"seed.bin": 1024})
        prefix = {(c.name, v): f"{base}/{c.name}-{v}" for c in todo for v in VERSIONS}
        for (_, v), p in prefix.items():  # the run's earlier commits (untimed)
            runner.upload(v, p, seed, list(range(1, KEEP + 1)))

        series: dict[tuple[str, str, str], Series] = {}
        for rnd in range(args.rounds):
            order = VERSIONS if rnd % 2 == 0 else VERSIONS[::-1]
            for case in todo:
                size = sum(p.stat().st_size for p in folders[case.name].rglob("*") if p.is_file())
                steps = [FIRST_STEP + rnd * case.repeats + i for i in range(case.repeats)]
                # Each version restores right after its own upload. Restored after both uploads,
                # the first restore of a pair ran at about half speed in most rounds, whichever
                # version it was (its objects the older ones in a page cache short of memory).
                for v in order:
                    m = runner.upload(v, prefix[case.name, v], folders[case.name], steps)
                    series.setdefault((case.name, "upload", v), Series(size)).rounds.append(m)
                    show(rnd, case.name, "upload", v, size, m)
                    m = runner.restore(v, prefix[case.name, v], steps[-1], case.repeats)
                    series.setdefault((case.name, "restore", v), Series(size)).rounds.append(m)
                    show(rnd, case.name, "restore", v, size, m)
        return {
            "cases": todo,
            "series": series,
            "rev": git("rev-parse", "--short", args.rev),
            "head": git("rev-parse", "--short", "HEAD"),
            "dirty": bool(git("status", "--porcelain", "--", "operator")),
            "load": (load_start, os.getloadavg()[0]),
            "rounds": args.rounds,
        }
    finally:
        try:
            keys = [k for k, _ in store.list_objects(base + "/")]
            if keys:
                store.delete(keys)
        except StorageError as e:  # the endpoint went away: say so, keep the first error
            print(f"could not remove s3://{s3.bucket}/{base}/: {e}", file=sys.stderr)
        shutil.rmtree(work, ignore_errors=True)


def show(rnd: int, case: str, op: str, version: str, size: int, m: Measure) -> None:
    print(
        f"round {rnd + 1} {case:<5} {op:<7} {version} {size / MiB / m.seconds:7.1f} MiB/s "
        f"{m.seconds * 1000:8.1f} ms/checkpoint {sum(m.calls.values()):5.0f} S3 calls "
        f"(settled {m.settled:.1f} s before)",
        flush=True,
    )


# ---------------------------------------------------------------------------------------------
# Figures


@dataclass(frozen=True)
class Figures:
    median: float
    low: float
    high: float
    ms: float  # median milliseconds per checkpoint
    cpu: float  # median client CPU seconds per checkpoint

    @property
    def spread(self) -> float:
        """The run-to-run noise: (max - min) / median."""
        return (self.high - self.low) / self.median


def figures(s: Series) -> Figures:
    rates = s.rates()
    return Figures(
        median=statistics.median(rates),
        low=min(rates),
        high=max(rates),
        ms=statistics.median(m.seconds for m in s.rounds) * 1000,
        cpu=statistics.median(m.cpu for m in s.rounds),
    )


def verdict(v1: Figures, v2: Figures) -> str:
    ratio = v2.median / v1.median
    if ratio >= 1:
        return "v2 not slower"
    if ratio >= 1 - v1.spread:
        return f"within noise ({(1 - ratio) * 100:.0f}% slower, v1's noise {v1.spread * 100:.0f}%)"
    return (
        f"**slower beyond noise** ({(1 - ratio) * 100:.0f}% slower, "
        f"v1's noise {v1.spread * 100:.0f}%)"
    )


def calls_text(calls: dict[str, float]) -> str:
    def n(x: float) -> str:
        return f"{x:.0f}" if abs(x - round(x)) < 0.05 else f"{x:.1f}"

    parts = [f"{name} {n(c)}" for name, c in sorted(calls.items(), key=lambda kv: -kv[1])]
    return f"{n(sum(calls.values()))}: " + ", ".join(parts)


def mean_calls(s: Series) -> dict[str, float]:
    names = {k for m in s.rounds for k in m.calls}
    return {k: statistics.fmean(m.calls.get(k, 0.0) for m in s.rounds) for k in names}


def report(result: dict[str, Any], command: str) -> str:
    series: dict[tuple[str, str, str], Series] = result["series"]
    load_start, load_end = result["load"]
    v2_what = "the working tree" + (
        f" (uncommitted changes on {result['head']})" if result["dirty"] else f" ({result['head']})"
    )
    lines = [
        SECTION,
        "",
        f"Command: `{command}`",
        "",
        f"v1 = commit {result['rev']}'s `operator/` (`git archive`), v2 = {v2_what}; "
        f"load average {load_start:.1f} at the start, {load_end:.1f} at the end. Each "
        "measurement is a child process with PYTHONPATH at that version's `operator/`, timing "
        f"only the work: `Sync.upload_checkpoint` of a started sidecar into a run that holds "
        f"{KEEP} committed checkpoints already (so each commit also drops and deletes one), and "
        f"`restore()` of the step just committed, right after. {result['rounds']} rounds, "
        "alternating (v1 then v2, the next round v2 then v1), the S3 server idle before each "
        "measurement. Noise: the rounds' min..max "
        "and spread (max - min) / median; paired: v2/v1 within each round. Within noise means "
        "v2/v1 >= 1 - v1's spread.",
    ]
    for case in result["cases"]:
        size = series[case.name, "upload", "v1"].bytes
        each = f", {case.repeats} checkpoints per measurement" if case.repeats > 1 else ""
        lines += [
            "",
            f"### {case.name.capitalize()}: {case.title}, {size / MiB:.1f} MiB{each}",
            "",
            "| operation | version | median MiB/s | min..max MiB/s | spread | ms/checkpoint "
            "| client CPU s/checkpoint |",
            "|---|---|---:|---:|---:|---:|---:|",
        ]
        for op in ("upload", "restore"):
            for v in VERSIONS:
                f = figures(series[case.name, op, v])
                lines.append(
                    f"| {op} | {v} | {f.median:.1f} | {f.low:.1f}..{f.high:.1f} | "
                    f"{f.spread * 100:.0f}% | {f.ms:.0f} | {f.cpu:.2f} |"
                )
        lines += ["", "| operation | v2/v1 (medians) | v2/v1 paired, min..max | verdict |"]
        lines.append("|---|---:|---:|---|")
        for op in ("upload", "restore"):
            one, two = series[case.name, op, "v1"], series[case.name, op, "v2"]
            f1, f2 = figures(one), figures(two)
            paired = [b / a for a, b in zip(one.rates(), two.rates(), strict=True)]
            lines.append(
                f"| {op} | {f2.median / f1.median:.2f}x | {statistics.median(paired):.2f}x, "
                f"{min(paired):.2f}..{max(paired):.2f} | {verdict(f1, f2)} |"
            )
    lines += [
        "",
        "### S3 calls per checkpoint (timed work only)",
        "",
        "| checkpoint | operation | v1 | v2 |",
        "|---|---|---|---|",
    ]
    for case in result["cases"]:
        for op in ("upload", "restore"):
            c1, c2 = (calls_text(mean_calls(series[case.name, op, v])) for v in VERSIONS)
            lines.append(f"| {case.name} | {op} | {c1} | {c2} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--rev", default="01b44ab", help="the git revision of version 1")
    parser.add_argument("--size-gib", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--small-files", type=int, default=20)
    parser.add_argument("--small-repeats", type=int, default=10)
    parser.add_argument("--write", type=Path, help="update this markdown file's section")
    args = parser.parse_args(argv)
    if args.child:
        return child_main()
    if not (1 <= args.rounds <= 100 and 1 <= args.small_repeats <= 100):
        parser.error("--rounds and --small-repeats: 1 to 100")
    if not (0 < args.size_gib <= 64 and 1 <= args.small_files <= 1000):
        parser.error("--size-gib: above 0, at most 64; --small-files: 1 to 1000")
    result = run(args)
    command = (
        f"python -m tests.bench_protocol --rev {args.rev} --size-gib {args.size_gib:g} "
        f"--rounds {args.rounds} --small-files {args.small_files} "
        f"--small-repeats {args.small_repeats}"
    )
    text = report(result, command)
    publish("protocol", text, args.write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
