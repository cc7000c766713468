"""Moving checkpoint files between a local folder and the bucket, in parallel and checksummed.

Upload: a file up to ``multipart_threshold`` is one checksummed PUT; a larger one is a multipart
upload whose parts are read (``pread``), checksummed and sent by a pool of workers, each part
checked by the endpoint, and the whole object checked again at completion with the combined
full-object checksum. Memory is a byte budget shared by every worker, not a count of parts: as
parts grow (the 10,000-part limit), fewer are in flight, and parts too large to hold are streamed
from the file (``trainingrun.agent.parts``). Small files go up packed (``trainingrun.agent.packs``).
Downloads are ``trainingrun.agent.download``'s, on the same workers. ``verify_uploaded`` checks what
an upload left in the bucket before its part record names it.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, cast

from trainingrun.agent.packs import Pack, PackChanged, gather
from trainingrun.agent.parts import (
    MIN_PARALLEL,
    ByteBudget,
    PartPlan,
    PartReader,
    Throttle,
    plan_parts,
    range_checksum,
    read_at,
)
from trainingrun.checkpoint.local import LocalCheckpoint
from trainingrun.checkpoint.manifest import FileEntry
from trainingrun.contract import format_bytes
from trainingrun.storage.checksum import Algorithm, digest, file_digest
from trainingrun.storage.opener import Store

log = logging.getLogger("trainingrun.agent.transfer")

T = TypeVar("T")

MiB = 1 << 20


class Cancelled(Exception):
    """The transfer was stopped (SIGTERM deadline); nothing it started is committed."""


class FileChanged(Exception):
    """A file changed while it was being uploaded; the checkpoint is not complete yet."""


class VerificationFailed(Exception):
    """A downloaded or uploaded object does not match its recorded size or checksum."""


@dataclass(frozen=True)
class TransferSettings:
    # 16 parts of 16 MiB in flight measured best against SeaweedFS on loopback (tests/
    # bench_transfer.py).
    part_size: int = 16 * MiB
    multipart_threshold: int = 16 * MiB
    # The restore's ranged GETs: half as many requests as 16 MiB ranges (each costs botocore's
    # per-request work in Python), four of a file at a time (download.RANGES_PER_FILE). Against
    # s5cmd on SeaweedFS on loopback, 1 GiB: 0.6-0.7x with 16 MiB ranges, 0.99-1.06x with 32 MiB
    # (tests/bench_transfer.py, docs/benchmarks.md).
    range_size: int = 32 * MiB
    concurrency: int = 16
    # Bytes of file data in memory at once, whatever the part size: half the sidecar's 512 MiB
    # limit, the rest for the interpreter, boto3 and the HTTP buffers.
    memory_budget: int = 256 * MiB
    # Bandwidth cap in bytes per second, None for none; so sync never starves the trainer's I/O.
    max_bytes_per_second: float | None = None


@dataclass
class Progress:
    """Bytes and files done of a transfer, logged as one readable line every ``every`` seconds."""

    what: str
    total_bytes: int
    total_files: int
    every: float = 5.0
    on_bytes: Callable[[int], None] | None = None
    done_bytes: int = 0
    done_files: int = 0
    started: float = field(default_factory=time.monotonic)
    _last_log: float = field(default_factory=time.monotonic)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, n: int) -> None:
        if self.on_bytes:
            self.on_bytes(n)
        with self._lock:
            self.done_bytes += n
            now = time.monotonic()
            if now - self._last_log < self.every:
                return
            self._last_log = now
        log.info("%s", self.line())

    def file_done(self) -> None:
        with self._lock:
            self.done_files += 1

    def rate(self) -> float:
        return self.done_bytes / max(time.monotonic() - self.started, 1e-6)

    def line(self) -> str:
        pct = 100 * self.done_bytes / self.total_bytes if self.total_bytes else 100
        return (
            f"{self.what}: {format_bytes(self.done_bytes)} / {format_bytes(self.total_bytes)} "
            f"({pct:.0f}%), {self.done_files}/{self.total_files} files, "
            f"{format_bytes(self.rate())}/s"
        )


@dataclass(frozen=True)
class _Upload:
    """One multipart upload in progress: what each of its parts needs."""

    fd: int
    key: str
    upload_id: str
    algo: Algorithm
    progress: Progress
    hold: int  # bytes one part holds in memory (the plan's buffer)


def _stat_key(st: os.stat_result) -> tuple[int, int, int]:
    return (st.st_size, st.st_mtime_ns, st.st_ino)


class Transfer:
    """One pool of workers; cancel() stops every file at its next part and aborts open
    multipart uploads, so nothing half-sent is left behind."""

    def __init__(self, store: Store, settings: TransferSettings) -> None:
        self.store = store
        self.settings = settings
        self.throttle = Throttle(settings.max_bytes_per_second)
        self.cancelled = threading.Event()
        # Files run on one pool, the parts of large files on another, so a file's worker that
        # waits for its parts can never starve the pool it runs on.
        self._pool = ThreadPoolExecutor(settings.concurrency, thread_name_prefix="file")
        self._parts = ThreadPoolExecutor(settings.concurrency, thread_name_prefix="part")
        # Every buffer in flight takes its bytes, whatever pool holds it: memory stays under
        # the budget however large the parts grow.
        self.budget = ByteBudget(settings.memory_budget)
        self._open: dict[str, str] = {}  # upload id -> key
        self._lock = threading.Lock()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._parts.shutdown(wait=True, cancel_futures=True)

    def cancel(self) -> None:
        self.cancelled.set()

    def abort_open_uploads(self) -> int:
        with self._lock:
            pending = list(self._open.items())
            self._open.clear()
        for upload_id, key in pending:
            try:
                self.store.abort_multipart(key, upload_id)
            except Exception as e:  # best effort; an unfinished upload is never committed
                log.warning("could not abort the multipart upload of %s: %s", key, e)
        return len(pending)

    def _check(self) -> None:
        if self.cancelled.is_set():
            raise Cancelled("transfer cancelled")

    # -- upload ---------------------------------------------------------------------------

    def upload_files(
        self,
        files: list[tuple[str, str]],
        algo: Algorithm,
        progress: Progress,
        packs: Sequence[tuple[Pack, Path, str]] = (),
    ) -> dict[str, str]:
        """Uploads (local path, key) pairs and (pack, its files' folder, part prefix) packs;
        returns key -> encoded full-object checksum, of each pack under its key and of each
        packed file under the key it would have on its own (prefix/path)."""
        futures: list[tuple[str, Future[str]]] = []
        packed: dict[str, str] = {}
        small: list[tuple[str, str]] = []
        large: list[tuple[str, str]] = []
        # A file read whole must leave room for others in the budget.
        whole = min(self.settings.multipart_threshold, self.settings.memory_budget // MIN_PARALLEL)
        for path, key in files:
            big = os.path.getsize(path) > whole
            (large if big else small).append((path, key))
        for path, key in large:  # the big ones first: their parts keep every worker busy
            futures.append((key, self._pool.submit(self._upload_large, path, key, algo, progress)))
        for pack, root, prefix in packs:
            key = f"{prefix}/{pack.name}"
            job = self._pool.submit(self._upload_pack, pack, root, prefix, algo, progress, packed)
            futures.append((key, job))
        for path, key in small:
            futures.append((key, self._pool.submit(self._upload_small, path, key, algo, progress)))
        return {**self._gather(futures), **packed}

    def _gather(self, futures: list[tuple[str, Future[T]]]) -> dict[str, T]:
        """Each future's result by its name; waits for all of them, then raises the first
        error."""
        results: dict[str, T] = {}
        error: BaseException | None = None
        for key, fut in futures:
            try:
                results[key] = fut.result()
            except BaseException as e:
                error = error or e
        if error:
            raise error
        return results

    def _upload_small(self, path: str, key: str, algo: Algorithm, progress: Progress) -> str:
        self._check()
        with open(path, "rb") as f:
            before = _stat_key(os.fstat(f.fileno()))
            with self.budget.take(before[0]):
                data = f.read()
                if _stat_key(os.fstat(f.fileno())) != before or len(data) != before[0]:
                    raise FileChanged(f"{path} changed while being read")
                checksum = digest(algo, data)
                self.throttle.take(len(data))
                self._check()
                self.store.put_checked(key, data, algo, checksum)
        progress.add(len(data))
        progress.file_done()
        return checksum

    def _upload_pack(
        self,
        pack: Pack,
        root: Path,
        prefix: str,
        algo: Algorithm,
        progress: Progress,
        sums: dict[str, str],
    ) -> str:
        """One pack: its files read and checksummed one by one, then one checked PUT."""
        self._check()
        with self.budget.take(2 * pack.size):  # the files read, then joined into one buffer
            try:
                data, each = gather(root, pack, algo)
            except PackChanged as e:
                raise FileChanged(str(e)) from e
            checksum = digest(algo, data)
            self.throttle.take(len(data))
            self._check()
            self.store.put_checked(f"{prefix}/{pack.name}", data, algo, checksum)
        sums.update({f"{prefix}/{path}": value for path, value in each.items()})
        progress.add(len(data))
        for _ in pack.members:
            progress.file_done()
        return checksum

    def plan(self, size: int) -> PartPlan:
        s = self.settings
        return plan_parts(size, s.part_size, s.memory_budget, s.concurrency)

    def _upload_large(self, path: str, key: str, algo: Algorithm, progress: Progress) -> str:
        """Runs in a worker: opens the upload, fans the parts out to the pool, completes."""
        self._check()
        fd = os.open(path, os.O_RDONLY)
        try:
            before = _stat_key(os.fstat(fd))
            plan = self.plan(before[0])
            if plan.part_size > self.settings.part_size:
                log.info("%s: %s", key, plan.describe(format_bytes))
            upload_id = self.store.create_multipart(key, algo)
            with self._lock:
                self._open[upload_id] = key
            upload = _Upload(fd, key, upload_id, algo, progress, plan.buffer)
            send = self._upload_streamed_part if plan.streamed else self._upload_part
            parts = list(self._parts.map(lambda r: send(upload, r), plan.ranges()))
            if _stat_key(os.fstat(fd)) != before:
                raise FileChanged(f"{path} changed while being uploaded")
            self._check()
            full = (
                algo.encode(algo.combine((p[1], p[2]) for p in parts)) if algo.combinable else None
            )
            entries = [p[0] for p in parts]
            self.store.complete_multipart(key, upload_id, entries, algo, full)
            with self._lock:
                self._open.pop(upload_id, None)
        except EOFError as e:
            self.abort_open_uploads_for(key)
            raise FileChanged(f"{path}: {e}") from e
        except BaseException:
            self.abort_open_uploads_for(key)
            raise
        finally:
            os.close(fd)
        progress.file_done()
        return full if full is not None else file_digest(algo, path)

    def abort_open_uploads_for(self, key: str) -> None:
        with self._lock:
            ids = [u for u, k in self._open.items() if k == key]
            for u in ids:
                self._open.pop(u)
        for u in ids:
            try:
                self.store.abort_multipart(key, u)
            except Exception as e:
                log.warning("could not abort the multipart upload of %s: %s", key, e)

    def _upload_part(
        self, u: _Upload, rng: tuple[int, int, int]
    ) -> tuple[dict[str, Any], int, int]:
        """One part held in memory: read once, checksummed, sent."""
        number, offset, length = rng
        self._check()
        with self.budget.take(length):
            data = read_at(u.fd, offset, length)
            crc = u.algo.of(data) if u.algo.combinable else 0
            encoded = u.algo.encode(crc) if u.algo.combinable else digest(u.algo, data)
            self.throttle.take(length)
            self._check()
            entry = self.store.upload_part(u.key, u.upload_id, number, data, u.algo, encoded)
        u.progress.add(length)
        return entry, crc, length

    def _upload_streamed_part(
        self, u: _Upload, rng: tuple[int, int, int]
    ) -> tuple[dict[str, Any], int, int]:
        """One part too large to hold: checksummed block by block, then sent from the file (the
        endpoint checks the checksum, so a range that changed in between is refused)."""
        number, offset, length = rng
        self._check()
        with self.budget.take(min(u.hold, length)):
            encoded, crc = range_checksum(u.fd, offset, length, u.algo)
            self.throttle.take(length)
            self._check()
            # Every Store.upload_part takes a seekable stream of the part's length as well as
            # bytes (storage.base.Store).
            body = cast(bytes, PartReader(u.fd, offset, length))
            entry = self.store.upload_part(u.key, u.upload_id, number, body, u.algo, encoded)
        u.progress.add(length)
        return entry, crc, length


def verify_uploaded(
    store: Store,
    ckpt: LocalCheckpoint,
    prefix: str,
    algo: Algorithm,
    sums: dict[str, str],
    workers: int = 16,
    packs: Sequence[Pack] = (),
) -> list[FileEntry]:
    """The MANIFEST.json entries of an uploaded checkpoint, once every object is there with the
    size we read and, where the endpoint stores it, our checksum; a packed file's object is its
    pack. A file whose size changed since the scan is still being written (FileChanged); a wrong
    object is VerificationFailed. The objects are looked at by ``workers`` at once: one at a
    time, the 1,000 files of an adapter checkpoint took longer to verify than to upload."""
    packed = {m.path: (p.name, m.offset) for p in packs for m in p.members}

    def check(key: str, size: int) -> None:
        head = store.head(key, algo)
        if head is None or head[0] != size:
            raise VerificationFailed(f"{key}: expected {size} bytes, found {head and head[0]}")
        if head[1] is not None and head[1] != sums[key]:
            raise VerificationFailed(f"{key}: stored checksum {head[1]} != ours {sums[key]}")

    def entry(file: tuple[str, int]) -> FileEntry:
        rel, size = file
        if (ckpt.path / rel).stat().st_size != size:
            raise FileChanged(f"{ckpt.path / rel} changed size during the upload")
        pack, offset = packed.get(rel, (None, 0))
        if pack is None:
            check(f"{prefix}/{rel}", size)
        checksum = sums[f"{prefix}/{rel}"]
        return FileEntry(
            path=rel,
            size=size,
            checksum_algorithm=algo.name,
            checksum=checksum,
            pack=pack,
            offset=offset,
        )

    jobs = len(ckpt.files) + len(packs)
    with ThreadPoolExecutor(max(1, min(workers, jobs)), thread_name_prefix="verify") as pool:
        list(pool.map(lambda p: check(f"{prefix}/{p.name}", p.size), packs))
        return list(pool.map(entry, ckpt.files))
