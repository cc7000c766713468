"""Benchmark: checkpoint upload (sync) and download (restore) on gs:// and az:// against each
store's own SDK at its best settings, on the emulators (fake-gcs-server, Azurite).

The gs:// and az:// counterpart of tests/bench_transfer.py (S3), with its checkpoint shape,
timing and CPU accounting. For each store a synthetic HF-like checkpoint goes to and from the
emulator on loopback with:

- ``sync``: the sidecar's upload path (``Sync.start`` then ``upload_checkpoint``: parallel
  checksummed parts, verify, MANIFEST.json, commit); ``restore``: the init container's path;
- gs://: google-cloud-storage's ``transfer_manager`` with thread workers, best of a small grid:
  ``upload_many_from_filenames`` / ``download_many_to_path`` (one request stream per file), and
  ``download_chunks_concurrently`` for the large files (ranged GETs). ``upload_chunks_concurrently``
  uses the XML API's multipart upload, which fake-gcs-server does not implement: it is tried once
  and its error reported;
- az://: azure-storage-blob's ``upload_blob(max_concurrency=N)`` / ``download_blob(max_concurrency
  =N).readinto(f)``, the files one after another (what the SDK offers) or several at once in a
  thread pool, best of the grid.

Rounds alternate the contenders (in an order shuffled each round, seeded, so no contender always
runs right after the same one) so the shared machine's noise falls on all alike; medians of the
rounds are reported. Every upload and download is checked byte for byte against the source once
per contender (not timed). A contender that fails is dropped from later rounds and its error is
reported.

    .venv/bin/python -m tests.bench_stores [--size-gib 0.5] [--rounds 3] \
        [--write docs/benchmarks.md]

Needs no cluster: the emulators are started here (tests/fakegcs.py, tests/azurite.py) on
127.0.0.1, with their data in memory (keep --size-gib under ~1).
"""

from __future__ import annotations

import argparse
import contextlib
import filecmp
import hashlib
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import urlsplit

from azure.storage.blob import ContainerClient
from azure.storage.blob import __version__ as azure_blob_version
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage as gcs
from google.cloud.storage import transfer_manager as tm
from requests import Session
from requests.adapters import HTTPAdapter

from tests import azurite, fakegcs
from tests.bench_transfer import (
    Sample,
    data_folder,
    ours_restore,
    ours_upload,
    shape,
    summarize,
    timed,
)
from tests.benchutil import cpu_seconds, shuffled, stamped, write_section
from tests.integration.agents import make_checkpoint
from trainingrun.agent.transfer import MiB
from trainingrun.checkpoint import local
from trainingrun.contract import checkpoint_dirname
from trainingrun.storage.opener import Location, Store, open_location, parse_uri

try:  # azure-core's own adapter (larger socket reads); private, so plain requests without it
    from azure.core.pipeline.transport._bigger_block_size_http_adapters import (
        BiggerBlockSizeHTTPAdapter as AzureAdapter,
    )
except ImportError:  # pragma: no cover
    AzureAdapter = HTTPAdapter  # type: ignore[misc,assignment]

SECTION = "## Transfer on gs:// and az:// (emulators)"
WORKERS = (8, 16)  # max_workers (GCS) / max_concurrency (Azure) tried for the baselines
GCS_CHUNK = 32 * MiB  # transfer_manager's default chunk for the *_chunks_concurrently calls
AZ_BLOCK = 16 * MiB  # Azure block / ranged-GET size of the baselines (the SDK's default is 4 MiB)
AZ_FILE_THREADS = 4  # files at once in the thread-pool variant
CALL_TIMEOUT = 300  # seconds: each SDK request of the baselines
XML_MPU = "upload_chunks_concurrently w8"  # tried once: fake-gcs-server has no XML multipart
GRACE_S = 120  # after a transfer's time limit: this long to unwind, then the emulators go


class TransferTimeout(Exception):
    """A contender took longer than --transfer-timeout."""


@dataclass
class Emulator:
    """What the benchmark needs of a running emulator."""

    label: str  # "gs://" or "az://"
    name: str  # the emulator and its version
    uri: str  # the bucket's (container's) uri
    endpoint: str
    secret: dict[str, str] | None
    pid: int  # the emulator's process, for its CPU
    kill: Callable[[], None]


@dataclass
class Outcome:
    """One store's samples: client time and CPU, the emulator's CPU, and what failed."""

    up: dict[str, list[Sample]] = field(default_factory=dict)
    down: dict[str, list[Sample]] = field(default_factory=dict)
    server_up: dict[str, list[float]] = field(default_factory=dict)
    server_down: dict[str, list[float]] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)  # "upload NAME" -> the error
    verified: list[str] = field(default_factory=list)
    stopped: str = ""  # why the rounds stopped early, if they did


# -- time limits -------------------------------------------------------------------------------

_KILLERS: list[Callable[[], None]] = []  # stop the running emulator (the last resort)
_ALARM = {"fired": False}


def _on_alarm(signum: int, frame: FrameType | None) -> None:
    del signum, frame
    if _ALARM["fired"]:
        # Still stuck GRACE_S after the limit: stop the emulator so every socket fails.
        print("a timed-out transfer did not unwind: stopping the emulator", file=sys.stderr)
        for kill in _KILLERS:
            kill()
        raise SystemExit(3)
    _ALARM["fired"] = True
    signal.alarm(GRACE_S)  # the time the transfer's threads get to unwind
    raise TransferTimeout


@contextmanager
def time_limit(seconds: int) -> Iterator[None]:
    """Raises TransferTimeout in the main thread after ``seconds``."""
    _ALARM["fired"] = False
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


# -- the contenders ----------------------------------------------------------------------------


def sha256(path: Path) -> bytes:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(MiB), b""):
            h.update(block)
    return h.digest()


class StoreBench:
    """The checkpoint, this package's sync and restore on one emulator, and its SDK baselines
    (``uploads`` / ``downloads`` in the subclasses)."""

    def __init__(self, emu: Emulator, ckpt: Path, step: int) -> None:
        self.emu = emu
        self.ckpt = ckpt
        self.step = step
        self.files = sorted(
            p for p in ckpt.rglob("*") if p.is_file() and p.name != local.COMPLETE_MARKER
        )
        self.rel = [p.relative_to(ckpt).as_posix() for p in self.files]
        self.bytes = sum(p.stat().st_size for p in self.files)
        self.root = parse_uri(emu.uri)
        self.digests = [sha256(p) for p in self.files]

    def location(self, prefix: str) -> Location:
        return parse_uri(f"{self.emu.uri}/{prefix}")

    def store(self, concurrency: int) -> Store:
        """As the sidecar and the init container open it (cli._agent_store)."""
        return open_location(
            self.root, self.emu.endpoint, None, self.emu.secret, pool=2 * concurrency + 4
        )

    def key(self, prefix: str) -> str:
        return self.root.key(prefix)

    def clean(self, prefix: str) -> None:
        store = self.store(4)
        keys = [k for k, _ in store.list_objects(self.key(prefix) + "/")]
        if keys:
            store.delete(keys)

    def data_prefix(self, prefix: str) -> str:
        """The key of the folder with the checkpoint's objects under ``prefix``."""
        return data_folder(self.store(4), self.key(prefix))

    # -- ours --------------------------------------------------------------------------------

    def ours_up(self, prefix: str) -> None:
        ours_upload(self.store, self.location(prefix), self.ckpt, self.step)

    def ours_down(self, prefix: str, dest: Path) -> None:
        ours_restore(self.store, self.location(prefix), dest, self.step)

    def uploads(self) -> dict[str, Callable[[str], None]]:
        raise NotImplementedError

    def downloads(self) -> dict[str, Callable[[str, Path], None]]:
        """Baselines: (the data prefix's key, destination folder)."""
        raise NotImplementedError

    def uploaded_mismatches(self, prefix: str, work: Path) -> list[str]:
        """The checkpoint's files that did not arrive byte-identical under ``prefix``. Sync's
        commit is read back with the restore into a folder under ``work`` (sync packs small
        files together, so they have no object of their own); a baseline's plain copy object by
        object, with this package's store."""
        folder = self.data_prefix(prefix)
        if folder != self.key(prefix):
            dest = work / "read-back"
            try:
                self.ours_down(prefix, dest)
                return self.mismatches(dest / checkpoint_dirname(self.step))
            finally:
                shutil.rmtree(dest, ignore_errors=True)
        store = self.store(4)
        sizes = dict(store.list_objects(folder + "/"))
        bad = []
        for rel, path, digest in zip(self.rel, self.files, self.digests, strict=True):
            key, size = f"{folder}/{rel}", path.stat().st_size
            h = hashlib.sha256()
            if sizes.get(key) == size and size:
                store.read_range(key, 0, size - 1, h.update)
            if sizes.get(key) != size or h.digest() != digest:
                bad.append(rel)
        return bad

    def mismatches(self, root: Path) -> list[str]:
        """The checkpoint's files not byte-identical under ``root`` (missing ones included)."""
        return [
            rel
            for rel, path in zip(self.rel, self.files, strict=True)
            if not (root / rel).is_file() or not filecmp.cmp(path, root / rel, shallow=False)
        ]


class GcsBench(StoreBench):
    def client(self, workers: int) -> Any:
        """The SDK's client on the emulator, anonymous, its HTTP pool as large as its workers."""
        client = gcs.Client(
            project="bench",
            credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call]
            client_options={"api_endpoint": self.emu.endpoint},
        )
        adapter = HTTPAdapter(pool_connections=workers + 4, pool_maxsize=workers + 4)
        for scheme in ("http://", "https://"):
            client._http.mount(scheme, adapter)
        return client.bucket(self.root.bucket)

    def many_up(
        self, prefix: str, workers: int, bucket: Any = None, names: list[str] | None = None
    ) -> None:
        tm.upload_many_from_filenames(
            bucket or self.client(workers),
            self.rel if names is None else names,
            source_directory=str(self.ckpt),
            blob_name_prefix=self.key(prefix) + "/",
            upload_kwargs={"timeout": CALL_TIMEOUT},
            deadline=CALL_TIMEOUT,
            raise_exception=True,
            worker_type=tm.THREAD,
            max_workers=workers,
        )

    def chunks_up(self, prefix: str, workers: int) -> None:
        """XML multipart for the large files, one after another; the rest as in many_up."""
        bucket = self.client(workers)
        for rel, path in zip(self.rel, self.files, strict=True):
            if path.stat().st_size > GCS_CHUNK:
                tm.upload_chunks_concurrently(
                    str(path),
                    bucket.blob(f"{self.key(prefix)}/{rel}"),
                    chunk_size=GCS_CHUNK,
                    deadline=CALL_TIMEOUT,
                    worker_type=tm.THREAD,
                    max_workers=workers,
                    timeout=CALL_TIMEOUT,
                )
        small = [
            r for r, p in zip(self.rel, self.files, strict=True) if p.stat().st_size <= GCS_CHUNK
        ]
        self.many_up(prefix, workers, bucket, small)

    def many_down(self, key: str, dest: Path, workers: int, names: list[str] | None = None) -> None:
        tm.download_many_to_path(
            self.client(workers),
            self.rel if names is None else names,
            destination_directory=str(dest),
            blob_name_prefix=key + "/",
            download_kwargs={"timeout": CALL_TIMEOUT},
            deadline=CALL_TIMEOUT,
            raise_exception=True,
            worker_type=tm.THREAD,
            max_workers=workers,
        )

    def chunks_down(self, key: str, dest: Path, workers: int) -> None:
        """Ranged GETs for the large files, one file after another; the rest as in many_down."""
        bucket = self.client(workers)
        small = []
        for rel, path in zip(self.rel, self.files, strict=True):
            if path.stat().st_size <= GCS_CHUNK:
                small.append(rel)
                continue
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            tm.download_chunks_concurrently(
                bucket.blob(f"{key}/{rel}"),
                str(target),
                chunk_size=GCS_CHUNK,
                download_kwargs={"timeout": CALL_TIMEOUT},
                deadline=CALL_TIMEOUT,
                worker_type=tm.THREAD,
                max_workers=workers,
            )
        self.many_down(key, dest, workers, small)

    def uploads(self) -> dict[str, Callable[[str], None]]:
        out: dict[str, Callable[[str], None]] = {}
        for w in WORKERS:
            out[f"upload_many w{w}"] = lambda p, w=w: self.many_up(p, w)  # type: ignore[misc]
        out[XML_MPU] = lambda p: self.chunks_up(p, 8)
        return out

    def downloads(self) -> dict[str, Callable[[str, Path], None]]:
        out: dict[str, Callable[[str, Path], None]] = {}
        for w in WORKERS:
            out[f"download_many w{w}"] = (
                lambda k, d, w=w: self.many_down(k, d, w)  # type: ignore[misc]
            )
            out[f"download_chunks_concurrently w{w}"] = (
                lambda k, d, w=w: self.chunks_down(k, d, w)  # type: ignore[misc]
            )
        return out


class AzureBench(StoreBench):
    def client(self, connections: int) -> Any:
        """The SDK's container client with AZ_BLOCK blocks and ranged GETs and an HTTP pool of
        ``connections`` (azure-core's default adapter keeps 10)."""
        session = Session()
        adapter = AzureAdapter(pool_connections=1, pool_maxsize=connections + 4)
        for scheme in ("http://", "https://"):
            session.mount(scheme, adapter)
        return ContainerClient(
            self.emu.endpoint,
            self.root.bucket,
            credential={"account_name": azurite.ACCOUNT, "account_key": azurite.KEY},
            session=session,
            max_block_size=AZ_BLOCK,
            max_single_put_size=AZ_BLOCK,
            max_chunk_get_size=AZ_BLOCK,
            max_single_get_size=AZ_BLOCK,
            connection_timeout=10,
            read_timeout=CALL_TIMEOUT,
        )

    def each_file(self, threads: int, fn: Callable[[str, Path], None]) -> None:
        if threads == 1:
            for rel, path in zip(self.rel, self.files, strict=True):
                fn(rel, path)
            return
        with ThreadPoolExecutor(threads) as pool:
            for f in [pool.submit(fn, r, p) for r, p in zip(self.rel, self.files, strict=True)]:
                f.result(timeout=CALL_TIMEOUT * 2)

    def up(self, prefix: str, concurrency: int, threads: int) -> None:
        container = self.client(concurrency * threads)

        def one(rel: str, path: Path) -> None:
            with path.open("rb") as f:
                container.get_blob_client(f"{self.key(prefix)}/{rel}").upload_blob(
                    f, length=path.stat().st_size, overwrite=True, max_concurrency=concurrency
                )

        self.each_file(threads, one)

    def down(self, key: str, dest: Path, concurrency: int, threads: int) -> None:
        container = self.client(concurrency * threads)

        def one(rel: str, path: Path) -> None:
            del path
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            with target.open("wb") as f:
                blob = container.get_blob_client(f"{key}/{rel}")
                blob.download_blob(max_concurrency=concurrency).readinto(f)

        self.each_file(threads, one)

    def grid(self) -> list[tuple[str, int, int]]:
        return [
            (f"{'files in sequence' if t == 1 else f'{t} files at once'} c{c}", c, t)
            for t in (1, AZ_FILE_THREADS)
            for c in WORKERS
        ]

    def uploads(self) -> dict[str, Callable[[str], None]]:
        return {
            f"upload_blob {n}": lambda p, c=c, t=t: self.up(p, c, t)  # type: ignore[misc]
            for n, c, t in self.grid()
        }

    def downloads(self) -> dict[str, Callable[[str, Path], None]]:
        return {
            f"download_blob {n}": lambda k, d, c=c, t=t: self.down(k, d, c, t)  # type: ignore[misc]
            for n, c, t in self.grid()
        }


# -- the rounds --------------------------------------------------------------------------------


def error_text(e: BaseException) -> str:
    """The exception, and for an HTTP error the request and the server's answer."""
    text = f"{type(e).__name__}: {e}"
    response: Any = getattr(e, "response", None)
    request = getattr(response, "request", None)
    if request is not None and hasattr(response, "text"):
        text += (
            f"; {request.method} {urlsplit(request.url).path}?{urlsplit(request.url).query} "
            f"answered {response.status_code} {response.text[:200]}"
        )
    return " ".join(text.split())[:600]


def run_store(bench: StoreBench, args: argparse.Namespace, work: Path, deadline: float) -> Outcome:
    out = Outcome()
    gib = bench.bytes / (1024 * MiB)
    base = f"bench-stores/{uuid.uuid4().hex[:8]}"
    source = f"{base}/source"
    label = bench.emu.label

    # What each client reads back: the restore the copy sync committed, the baselines a plain
    # copy of the folder made by the first baseline upload (sync packs small files together).
    plain = f"{base}/plain"
    baseline_ups = bench.uploads()
    first = next(iter(baseline_ups))
    print(f"{label}: the restore's source (sync) and the baselines' ({first}) ...", flush=True)
    for who, prefix, upload in (
        ("sync", source, bench.ours_up),
        (first, plain, baseline_ups[first]),
    ):
        try:
            with time_limit(args.transfer_timeout):
                upload(prefix)
            bad = bench.uploaded_mismatches(prefix, work)
            if bad:
                raise RuntimeError(f"not byte-identical: {', '.join(bad)}")
        except Exception as e:
            out.failed[f"upload {who}"] = f"the source copy for the downloads: {error_text(e)}"
            out.stopped = "a source copy for the downloads failed: nothing else was measured"
            traceback.print_exc(limit=5)
            return out
    key = bench.key(plain)

    ups: dict[str, Callable[[str], None]] = {"sync": bench.ours_up, **baseline_ups}
    downs: dict[str, Callable[[Path], None]] = {"restore": lambda d: bench.ours_down(source, d)}
    for name, fn in bench.downloads().items():
        downs[name] = lambda d, fn=fn: fn(key, d)  # type: ignore[misc]

    def attempt(rnd: int, op: str, name: str) -> None:
        """One timed transfer; a failure is recorded (the contender is not run again)."""
        prefix = f"{base}/up-{rnd}-{uuid.uuid4().hex[:6]}"
        dest = work / f"down-{rnd}"
        server = cpu_seconds(bench.emu.pid)
        try:
            with time_limit(args.transfer_timeout):
                if op == "upload":
                    sample = timed(lambda: ups[name](prefix))
                else:
                    sample = timed(lambda: downs[name](dest))
            server = cpu_seconds(bench.emu.pid) - server
            if f"{op} {name}" not in out.verified:  # once per contender, untimed
                if op == "download":
                    root = dest / checkpoint_dirname(bench.step) if name == "restore" else dest
                    bad = bench.mismatches(root)
                else:
                    bad = bench.uploaded_mismatches(prefix, work)
                if bad:
                    raise RuntimeError(f"{op} not byte-identical: {', '.join(bad)}")
                out.verified.append(f"{op} {name}")
        except Exception as e:
            what = (
                f"timed out after {args.transfer_timeout} s"
                if isinstance(e, TransferTimeout)
                else error_text(e)
            )
            out.failed[f"{op} {name}"] = f"round {rnd + 1}: {what}"
            print(f"round {rnd + 1} {label} {op:<8} {name:<40} FAILED: {what}", flush=True)
            traceback.print_exc(limit=5)
        else:
            key = "up" if op == "upload" else "down"
            getattr(out, key).setdefault(name, []).append(sample)
            getattr(out, f"server_{key}").setdefault(name, []).append(server)
            print(
                f"round {rnd + 1} {label} {op:<8} {name:<40} "
                f"{gib * 1024 / sample.seconds:5.0f} MiB/s, "
                f"CPU {sample.cpu_seconds / gib:5.2f} s/GiB, emulator {server / gib:5.2f}",
                flush=True,
            )
        finally:
            shutil.rmtree(dest, ignore_errors=True)
            if op == "upload":
                bench.clean(prefix)

    for rnd in range(args.rounds):
        for op, contenders in (("upload", list(ups)), ("download", list(downs))):
            names = [n for n in contenders if f"{op} {n}" not in out.failed]
            for name in shuffled(names, op, rnd):
                if time.monotonic() > deadline:
                    out.stopped = (
                        f"the time budget (--max-minutes {args.max_minutes}) ran out in "
                        f"round {rnd + 1}"
                    )
                    bench.clean(base)
                    return out
                attempt(rnd, op, name)
    bench.clean(base)
    return out


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def start_gcs(stack: list[Any], folder: Path) -> Emulator:
    g = fakegcs.FakeGcs(folder)
    stack.append(g.__enter__())
    assert g.proc is not None
    pid = g.proc.pid
    return Emulator(
        "gs://",
        f"fake-gcs-server {fakegcs.binary().parent.name.removeprefix('fake-gcs-server-')}",
        f"gs://{g.bucket}",
        g.endpoint,
        None,  # unsigned, to the emulator
        pid,
        lambda: _kill(pid),
    )


def start_azurite(stack: list[Any], folder: Path) -> Emulator:
    a = azurite.Azurite(folder, debug=False)
    stack.append(a.__enter__())
    assert a.proc is not None
    pid = a.proc.pid
    return Emulator(
        "az://",
        f"Azurite {azurite.binary().parents[2].name.removeprefix('azurite-')}",
        f"az://{a.account}/{a.container}",
        a.endpoint,
        {"AZURE_STORAGE_KEY": a.key},
        pid,
        lambda: _kill(pid),
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="bench-stores-"))
    step = 1000
    deadline = time.monotonic() + args.max_minutes * 60
    load = [os.getloadavg()[0]]
    results: dict[str, Any] = {"stores": {}}
    try:
        print(f"writing a {args.size_gib} GiB checkpoint to {work} ...", flush=True)
        ckpt = make_checkpoint(work / "ck", step, shape(args.size_gib))
        starters = {"gs": (start_gcs, GcsBench), "az": (start_azurite, AzureBench)}
        for scheme in args.stores:
            start, kind = starters[scheme]
            stack: list[Any] = []
            try:
                emu = start(stack, work / f"emulator-{scheme}")
                _KILLERS.append(emu.kill)
                bench = kind(emu, ckpt, step)
                results["gib"] = bench.bytes / (1024 * MiB)
                results["files"] = len(bench.files)
                results["stores"][scheme] = (emu, run_store(bench, args, work, deadline))
            finally:
                for emulator in reversed(stack):
                    emulator.__exit__(None, None, None)
                _KILLERS.clear()
            load.append(os.getloadavg()[0])
        results["load"] = load
        results["rounds"] = args.rounds
        return results
    finally:
        shutil.rmtree(work, ignore_errors=True)


# -- the report --------------------------------------------------------------------------------


def store_report(
    emu: Emulator, out: Outcome, gib: float, rounds: int
) -> tuple[list[str], list[str]]:
    lines = [f"### {emu.label} ({emu.name}, in memory)", ""]
    verdicts = []
    for title, key, op, ours in (
        ("Upload", "up", "upload", "sync"),
        ("Download", "down", "download", "restore"),
    ):
        samples: dict[str, list[Sample]] = getattr(out, key)
        rows = summarize(samples, gib)
        server = {n: statistics.median(v) / gib for n, v in getattr(out, f"server_{key}").items()}
        baselines = [(n, v) for n, v in rows.items() if n != ours]
        best = max((v[0] for _, v in baselines), default=0.0)
        lines += [
            f"{title}:",
            "",
            "| client | MiB/s | CPU s/GiB | emulator CPU s/GiB | vs best baseline |",
            "|---|---:|---:|---:|---:|",
        ]
        for name, (rate, cpu) in sorted(rows.items(), key=lambda nv: -nv[1][0]):
            runs = len(samples[name])
            shown = name if runs == rounds else f"{name} ({runs} of {rounds} rounds)"
            vs = f"{rate / best:.2f}x" if best else "-"
            lines.append(f"| {shown} | {rate:.0f} | {cpu:.2f} | {server[name]:.2f} | {vs} |")
        for what in out.failed:
            failed_op, _, name = what.partition(" ")
            if failed_op == op and name not in rows:
                lines.append(f"| {name} | failed | - | - | - |")
        lines.append("")
        if ours in rows and baselines:
            best_name, (best, best_cpu) = max(baselines, key=lambda nv: nv[1][0])
            verdicts.append(
                f"{emu.label} {ours}: {rows[ours][0] / best:.2f}x the best baseline "
                f"({best_name}, {best:.0f} MiB/s); CPU {rows[ours][1]:.2f} against "
                f"{best_cpu:.2f} s/GiB"
            )
        else:
            verdicts.append(f"{emu.label} {ours}: no ratio (ours or every baseline failed)")
    lines += [f"- failed: {what}: {err}" for what, err in out.failed.items()]
    if out.stopped:
        lines.append(f"- stopped early: {out.stopped}")
    checked = ", ".join(out.verified) or "none"
    lines += [f"- checked byte for byte (once each, untimed): {checked}", ""]
    return lines, verdicts


def report(result: dict[str, Any], command: str) -> str:
    gib = result["gib"]
    load = ", ".join(f"{x:.1f}" for x in result["load"])
    lines = [
        SECTION,
        "",
        f"Command: `{command}`",
        "",
        f"A {gib:.2f} GiB checkpoint in "
        f"{result['files']} files (the shape of tests/bench_transfer.py: weights, optimizer, "
        f"small files) to and from each emulator, {result['rounds']} alternating round(s), "
        "medians. CPU is this client process's (user + system, counted as "
        "tests/bench_transfer.py counts it); the emulator's own CPU is in its column. "
        f"Baselines: google-cloud-storage {gcs.__version__} `transfer_manager` with thread "
        f"workers (w = max_workers, {GCS_CHUNK // MiB} MiB chunks), azure-storage-blob "
        f"{azure_blob_version} with {AZ_BLOCK // MiB} MiB blocks and ranged GETs "
        "(c = max_concurrency), each with its HTTP pool as large as its concurrency and its "
        "SDK's default checksums. Ours: its defaults (16 parts of 16 MiB in flight), the store "
        "opened with `storage.open_location` as the sidecar opens it; sync's time includes its "
        "start (capability probe, fence) and the commit, as in tests/bench_transfer.py.",
        "",
        "Machine: 2 cores, shared with whatever else runs (load average "
        f"{load} at the start and after each store). The emulators listen on 127.0.0.1 of the "
        "same machine: no network, and the emulator's CPU competes with the client's for the "
        "same 2 cores.",
        "",
    ]
    verdicts: list[str] = []
    xml_mpu = ""
    for scheme, (emu, out) in result["stores"].items():
        body, found = store_report(emu, out, gib, result["rounds"])
        lines += body
        verdicts += found
        if scheme == "gs":
            err = out.failed.get(f"upload {XML_MPU}")
            if err:
                xml_mpu = "it failed on the emulator (its error is listed above)"
            elif XML_MPU in out.up:
                xml_mpu = "yet it worked on the emulator (its row above)"
    lines += ["Ours against each store's best baseline, same run:", ""]
    lines += [f"- {v}" for v in verdicts]
    if xml_mpu:
        lines.append(
            "- gs:// `upload_chunks_concurrently`, the SDK's parallel upload of one file, uses "
            "the XML API's multipart upload, which fake-gcs-server does not implement: "
            f"{xml_mpu}. The gs:// upload baselines that count are therefore per-file "
            "parallelism (`upload_many_from_filenames`): one stream per file, so the two large "
            "files go up in two streams."
        )
    lines += [
        "",
        "What an emulator can and cannot tell: both clients talk to the same server in the same "
        "run, so the figures compare their request patterns and their CPU per GiB, and show "
        "whether ours keeps up with the SDK on that server. They say nothing about the real "
        "services' throughput, latency, per-connection or per-object limits, throttling or "
        "server-side checksum work: fake-gcs-server (Go) and Azurite (Node.js) are single "
        "processes holding the data in memory on loopback and sharing the 2 cores with the "
        "client, so the absolute MiB/s are not what GCS or Azure Blob Storage give, and the "
        "ratios may move on the real services.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-gib", type=float, default=0.5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--stores", nargs="+", choices=("gs", "az"), default=["gs", "az"])
    parser.add_argument("--transfer-timeout", type=int, default=600, help="seconds per transfer")
    parser.add_argument("--max-minutes", type=float, default=45, help="budget of all rounds")
    parser.add_argument("--write", type=Path, help="update this markdown file's section")
    args = parser.parse_args(argv)
    if not 0 < args.size_gib <= 1.5:
        parser.error("--size-gib: the emulators hold everything in memory; keep it in (0, 1.5]")
    if not 1 <= args.rounds <= 20:
        parser.error("--rounds: 1 to 20")
    result = run(args)
    if "gib" not in result:
        sys.exit("no store was measured")
    command = f"python -m tests.bench_stores --size-gib {args.size_gib} --rounds {args.rounds}"
    if args.stores != ["gs", "az"]:
        command += f" --stores {' '.join(args.stores)}"
    text = report(result, command)
    print(text)
    if args.write:
        write_section(args.write, "stores", stamped(text))
    return 0


if __name__ == "__main__":
    sys.exit(main())
