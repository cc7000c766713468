"""Benchmark: checkpoint upload (sync) and download (restore) against the best baselines.

Builds a synthetic ~2 GiB checkpoint shaped like a HuggingFace Trainer's (one large weights file,
a larger optimizer file, several small files) and moves it to and from the local SeaweedFS on
loopback with:

- ``sync``: the sidecar's own upload path (parallel checksummed parts, verify, MANIFEST.json,
  compare-and-swap commit); ``restore``: the init container's path (parallel ranged GETs,
  checksums verified as they land);
- plain boto3 ``upload_file`` / ``download_file`` in a loop over the files, with the best of a
  small grid of ``TransferConfig`` settings (concurrency x chunk size);
- ``rclone copy`` (Debian package) with ``--transfers``/``--s3-upload-concurrency`` tuned the same
  way, best of its grid.

Rounds alternate the contenders so the shared machine's noise falls on all of them alike; the
median of the rounds is reported, with CPU seconds per GiB of the client (the S3 server's CPU is
not counted for anyone). Targets: sync >= 0.9x and restore >= 0.9x the best baseline.

    .venv/bin/python -m tests.bench_transfer [--size-gib 2] [--rounds 3] \
        [--write docs/benchmarks.md]

Needs ``rclone`` on PATH (``make bench-tools``); uses the local environment (``make cluster``),
starting it when it is not up.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
from boto3.s3.transfer import TransferConfig
from botocore.config import Config

from tests import localenv
from tests.benchutil import write_section
from tests.integration.agents import S3, make_checkpoint
from trainingrun import local
from trainingrun.local import scan
from trainingrun.restore import RestoreSettings, restore
from trainingrun.storage import Credentials, Location, S3Store, Store, make_client
from trainingrun.sync import Sync, SyncSettings
from trainingrun.transfer import MiB, TransferSettings

REPO = Path(__file__).resolve().parent.parent
SECTION = "## Checkpoint upload and restore against boto3 and rclone"
GRID = [(8, 16), (8, 64), (16, 32)]  # (concurrency, part/chunk MiB) tried for the baselines


def shape(total_gib: float) -> dict[str, int]:
    """An HF-like checkpoint: weights 1/3, optimizer 2/3, and the usual small files."""
    total = int(total_gib * 1024 * MiB)
    return {
        "model.safetensors": total // 3,
        "optimizer.pt": total - total // 3 - 4 * MiB,
        "tokenizer.json": 3 * MiB,
        "scheduler.pt": 1064,
        "rng_state.pth": 14_244,
        "training_args.bin": 5_368,
        "config.json": 812,
        "generation_config.json": 124,
    }


@dataclass
class Sample:
    seconds: float
    cpu_seconds: float


def cpu_now() -> float:
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def timed(fn: Callable[[], None]) -> Sample:
    cpu, wall = cpu_now(), time.perf_counter()
    fn()
    return Sample(time.perf_counter() - wall, cpu_now() - cpu)


def ours_upload(open_store: Callable[[int], Any], run: Location, ckpt: Path, step: int) -> None:
    """The sidecar's upload of checkpoint ``step`` (folder ``ckpt``) with its defaults: start
    (capability probe, fence), upload, verify, commit. ``open_store(pool size)``."""
    settings = SyncSettings(
        checkpoint_dir=ckpt.parent, run=run, keep=3, transfer=TransferSettings()
    )
    sync = Sync(open_store(settings.transfer.concurrency), settings)
    sync.start()
    (found,) = [c for c in scan(ckpt.parent) if c.step == step]
    sync.upload_checkpoint(found)
    sync.transfer.close()


def ours_restore(open_store: Callable[[int], Any], run: Location, dest: Path, step: int) -> None:
    """The init container's restore of checkpoint ``step`` into ``dest``, with its defaults."""
    settings = RestoreSettings(checkpoint_dir=dest, run=run, step=step)
    restore(open_store(settings.transfer.concurrency), settings)


class Bench:
    def __init__(self, s3: S3, work: Path, ckpt: Path, step: int) -> None:
        self.s3 = s3
        self.work = work
        self.ckpt = ckpt
        self.step = step
        self.bytes = sum(p.stat().st_size for p in ckpt.rglob("*") if p.is_file())
        self.files = sorted(
            p for p in ckpt.rglob("*") if p.is_file() and p.name != local.COMPLETE_MARKER
        )
        self.client = s3.client()
        self.creds = Credentials(s3.access_key, s3.secret_key)

    def store(self, concurrency: int) -> Store:
        return S3Store(
            make_client(self.s3.endpoint, self.s3.region, self.creds, 2 * concurrency + 4),
            self.s3.bucket,
        )

    def clean(self, prefix: str) -> None:
        keys = [k for k, _ in self.store(4).list_objects(prefix)]
        if keys:
            self.store(4).delete(keys)

    # -- ours ------------------------------------------------------------------------------

    def ours_up(self, prefix: str) -> None:
        ours_upload(self.store, Location(self.s3.bucket, prefix), self.ckpt, self.step)

    def ours_down(self, prefix: str, dest: Path) -> None:
        ours_restore(self.store, Location(self.s3.bucket, prefix), dest, self.step)

    # -- boto3 -----------------------------------------------------------------------------

    def boto3_config(self, concurrency: int, chunk_mib: int) -> TransferConfig:
        return TransferConfig(
            multipart_threshold=chunk_mib * MiB,
            multipart_chunksize=chunk_mib * MiB,
            max_concurrency=concurrency,
            use_threads=True,
        )

    def boto3_client(self, concurrency: int) -> Any:
        return boto3.client(
            "s3",
            endpoint_url=self.s3.endpoint,
            aws_access_key_id=self.s3.access_key,
            aws_secret_access_key=self.s3.secret_key,
            region_name=self.s3.region,
            config=Config(max_pool_connections=concurrency + 4, s3={"addressing_style": "path"}),
        )

    def boto3_up(self, prefix: str, concurrency: int, chunk: int) -> None:
        client, config = self.boto3_client(concurrency), self.boto3_config(concurrency, chunk)
        for path in self.files:
            key = f"{prefix}/{path.relative_to(self.ckpt).as_posix()}"
            client.upload_file(str(path), self.s3.bucket, key, Config=config)

    def boto3_down(self, prefix: str, dest: Path, concurrency: int, chunk: int) -> None:
        client, config = self.boto3_client(concurrency), self.boto3_config(concurrency, chunk)
        for path in self.files:
            rel = path.relative_to(self.ckpt).as_posix()
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            client.download_file(self.s3.bucket, f"{prefix}/{rel}", str(target), Config=config)

    # -- rclone ----------------------------------------------------------------------------

    def rclone(self, src: str, dst: str, concurrency: int, chunk: int) -> None:
        # An AWS_CA_BUNDLE in the environment breaks rclone 1.60's plain-HTTP client.
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env |= {
            "RCLONE_CONFIG_BENCH_TYPE": "s3",
            "RCLONE_CONFIG_BENCH_PROVIDER": "Other",
            "RCLONE_CONFIG_BENCH_ENDPOINT": self.s3.endpoint,
            "RCLONE_CONFIG_BENCH_ACCESS_KEY_ID": self.s3.access_key,
            "RCLONE_CONFIG_BENCH_SECRET_ACCESS_KEY": self.s3.secret_key,
            "RCLONE_CONFIG_BENCH_REGION": self.s3.region,
            "RCLONE_CONFIG_BENCH_FORCE_PATH_STYLE": "true",
        }
        subprocess.run(
            [
                "rclone",
                "copy",
                src,
                dst,
                f"--transfers={concurrency}",
                f"--checkers={concurrency}",
                f"--s3-upload-concurrency={concurrency}",
                f"--s3-chunk-size={chunk}M",
                f"--s3-upload-cutoff={chunk}M",
                f"--multi-thread-streams={concurrency}",
                "--multi-thread-cutoff=64M",
                "--config=/dev/null",
            ],
            env=env,
            check=True,
            capture_output=True,
            timeout=1800,
        )

    def rclone_up(self, prefix: str, concurrency: int, chunk: int) -> None:
        self.rclone(str(self.ckpt), f"bench:{self.s3.bucket}/{prefix}", concurrency, chunk)

    def rclone_down(self, prefix: str, dest: Path, concurrency: int, chunk: int) -> None:
        self.rclone(f"bench:{self.s3.bucket}/{prefix}", str(dest), concurrency, chunk)


def run(args: argparse.Namespace) -> dict[str, Any]:
    if not shutil.which("rclone"):
        sys.exit("rclone is not on PATH: run 'make bench-tools' (Debian package rclone)")
    env = localenv.load() or localenv.up()
    s3 = S3.of(env)
    work = Path(tempfile.mkdtemp(prefix="bench-transfer-"))
    step = 1000
    try:
        sizes = shape(args.size_gib)
        print(f"writing a {args.size_gib} GiB checkpoint to {work} ...", flush=True)
        ckpt = make_checkpoint(work / "ck", step, sizes)
        bench = Bench(s3, work, ckpt, step)
        gib = bench.bytes / (1024 * MiB)
        base = f"bench-transfer/{uuid.uuid4().hex[:8]}"
        up: dict[str, list[Sample]] = {}
        down: dict[str, list[Sample]] = {}

        contenders_up: dict[str, Callable[[str], None]] = {"sync": bench.ours_up}
        contenders_down: dict[str, Callable[[str, Path], None]] = {"restore": bench.ours_down}
        for c, k in GRID:
            contenders_up[f"boto3 c{c} {k}MiB"] = (
                lambda p, c=c, k=k: bench.boto3_up(p, c, k)  # type: ignore[misc]
            )
            contenders_up[f"rclone c{c} {k}MiB"] = (
                lambda p, c=c, k=k: bench.rclone_up(p, c, k)  # type: ignore[misc]
            )
            contenders_down[f"boto3 c{c} {k}MiB"] = (
                lambda p, d, c=c, k=k: bench.boto3_down(p, d, c, k)  # type: ignore[misc]
            )
            contenders_down[f"rclone c{c} {k}MiB"] = (
                lambda p, d, c=c, k=k: bench.rclone_down(p, d, c, k)  # type: ignore[misc]
            )

        # The restore source: one committed copy made by sync.
        source = f"{base}/source"
        bench.ours_up(source)
        ckpt_prefix = f"{source}/checkpoints/checkpoint-{step}"

        for rnd in range(args.rounds):
            names = list(contenders_up)
            names = names[rnd % len(names) :] + names[: rnd % len(names)]
            for name in names:
                prefix = f"{base}/up-{rnd}-{abs(hash(name)) % 10**6}"
                sample = timed(lambda name=name, prefix=prefix: contenders_up[name](prefix))
                up.setdefault(name, []).append(sample)
                print(
                    f"round {rnd + 1} upload   {name:<20} {gib / sample.seconds * 1024:7.0f} MiB/s",
                    flush=True,
                )
                bench.clean(prefix)
            names = list(contenders_down)
            names = names[rnd % len(names) :] + names[: rnd % len(names)]
            for name in names:
                dest = work / f"down-{rnd}"
                prefix = source if name == "restore" else ckpt_prefix
                sample = timed(
                    lambda name=name, prefix=prefix, dest=dest: contenders_down[name](prefix, dest)
                )
                down.setdefault(name, []).append(sample)
                print(
                    f"round {rnd + 1} download {name:<20} {gib / sample.seconds * 1024:7.0f} MiB/s",
                    flush=True,
                )
                shutil.rmtree(dest, ignore_errors=True)
        bench.clean(base)
        return {
            "gib": gib,
            "files": len(bench.files),
            "up": up,
            "down": down,
            "rounds": args.rounds,
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)


def summarize(samples: dict[str, list[Sample]], gib: float) -> dict[str, tuple[float, float]]:
    """name -> (median MiB/s, median CPU seconds per GiB)."""
    return {
        name: (
            statistics.median(gib * 1024 / s.seconds for s in ss),
            statistics.median(s.cpu_seconds / gib for s in ss),
        )
        for name, ss in samples.items()
    }


def report(result: dict[str, Any], command: str) -> str:
    gib = result["gib"]
    lines = [SECTION, "", f"Command: `{command}`", ""]
    lines.append(
        f"A {gib:.2f} GiB checkpoint in {result['files']} files (weights, optimizer, small files) "
        f"to and from SeaweedFS on loopback, {result['rounds']} alternating rounds, medians. "
        "CPU is the client's (user + system), not the server's."
    )
    verdicts = []
    for title, key, ours in (("Upload", "up", "sync"), ("Download", "down", "restore")):
        rows = summarize(result[key], gib)
        best_name, (best_rate, _) = max(
            ((n, v) for n, v in rows.items() if n != ours), key=lambda nv: nv[1][0]
        )
        ratio = rows[ours][0] / best_rate
        lines += [
            "",
            f"### {title}",
            "",
            "| client | MiB/s | CPU s/GiB | vs best baseline |",
            "|---|---:|---:|---:|",
        ]
        for name, (rate, cpu) in sorted(rows.items(), key=lambda nv: -nv[1][0]):
            lines.append(f"| {name} | {rate:.0f} | {cpu:.2f} | {rate / best_rate:.2f}x |")
        verdict = "met" if ratio >= 0.9 else "NOT met"
        verdicts.append(
            f"{ours} = {ratio:.2f}x the best baseline ({best_name}): target 0.9x {verdict}"
        )
    lines += ["", *[f"- {v}" for v in verdicts], ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-gib", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--write", type=Path, help="update this markdown file's section")
    args = parser.parse_args(argv)
    result = run(args)
    command = f"python -m tests.bench_transfer --size-gib {args.size_gib} --rounds {args.rounds}"
    text = report(result, command)
    print(text)
    if args.write:
        write_section(args.write, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
