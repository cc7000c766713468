"""How a large file goes up in parts within a memory budget, and the budget the workers share.

S3 allows at most ``MAX_PARTS`` parts, so a file above 10,000 x the part size (about 160 GiB with
16 MiB parts) gets larger parts. Memory is budgeted in bytes, not parts: a part held in memory
while it is checksummed and sent counts its size, so the parts in flight are
``budget // part size`` (at most the concurrency setting). Where that would leave fewer than
``MIN_PARALLEL`` parts in flight (parts above a quarter of the budget: files above about 625 GiB
with the defaults) the parts are streamed from the file instead: checksummed block by block, then
sent from the file, each holding one ``STREAM_BLOCK`` in memory; so a 5 TiB file (parts of
525 MiB) fits the sidecar's memory limit too, at the cost of reading each byte twice.

Stdlib and ``trainingrun.storage.checksum`` only: the plan is a pure function of sizes and settings.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from trainingrun.storage.checksum import Algorithm

MiB = 1 << 20
MAX_PARTS = 10_000  # S3's limit on the parts of one multipart upload
# What a streamed part holds in memory at once (and a ranged download: storage.read_range's
# block); S3 reads the rest from the file.
STREAM_BLOCK = 8 * MiB
# Fewer parts in flight than this would cost more throughput than reading every byte twice.
MIN_PARALLEL = 4


@dataclass(frozen=True)
class PartPlan:
    """The parts of one file: their size, whether they are streamed, and how many are in
    flight at once."""

    size: int
    part_size: int
    streamed: bool
    concurrency: int

    @property
    def parts(self) -> int:
        return max(1, -(-self.size // self.part_size))

    @property
    def buffer(self) -> int:
        """Bytes one part in flight holds in memory."""
        return min(STREAM_BLOCK, self.part_size) if self.streamed else self.part_size

    @property
    def in_flight(self) -> int:
        """Bytes in memory with every part slot busy."""
        return self.buffer * self.concurrency

    def describe(self, size_text: Callable[[float], str]) -> str:
        return (
            f"{size_text(self.size)} in {self.parts} parts of {size_text(self.part_size)} (the "
            f"10,000-part limit), {self.concurrency} in flight"
            + (", streamed from the file" if self.streamed else "")
        )

    def ranges(self) -> list[tuple[int, int, int]]:
        """(part number, offset, length) of every part, in order."""
        step = self.part_size
        return [
            (i + 1, off, min(step, self.size - off))
            for i, off in enumerate(range(0, self.size, step))
        ]


def plan_parts(size: int, part_size: int, budget: int, concurrency: int) -> PartPlan:
    """How a file of ``size`` bytes goes up: parts of at least ``part_size``, at most
    ``MAX_PARTS`` of them, at most ``budget`` bytes of them in memory."""
    part = max(part_size, -(-size // MAX_PARTS))
    buffered = min(concurrency, budget // part)
    if buffered >= min(MIN_PARALLEL, concurrency):
        return PartPlan(size, part, streamed=False, concurrency=max(1, buffered))
    streams = min(concurrency, budget // min(STREAM_BLOCK, part))
    return PartPlan(size, part, streamed=True, concurrency=max(1, streams))


class ByteBudget:
    """Bytes in memory across every worker of a transfer: ``take(n)`` waits until ``n`` more
    fit. One request larger than the whole budget still runs, alone, rather than never."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.used = 0
        self.peak = 0
        self._cond = threading.Condition()

    @contextmanager
    def take(self, n: int) -> Iterator[None]:
        with self._cond:
            while self.used and self.used + n > self.budget:
                self._cond.wait()
            self.used += n
            self.peak = max(self.peak, self.used)
        try:
            yield
        finally:
            with self._cond:
                self.used -= n
                self._cond.notify_all()


def read_at(fd: int, offset: int, length: int) -> bytes:
    """``length`` bytes at ``offset``; a file that ends sooner raises EOFError."""
    chunks = []
    while length:
        chunk = os.pread(fd, length, offset)
        if not chunk:
            raise EOFError(f"file shrank while being read at offset {offset}")
        chunks.append(chunk)
        offset += len(chunk)
        length -= len(chunk)
    return b"".join(chunks)


def range_checksum(fd: int, offset: int, length: int, algo: Algorithm) -> tuple[str, int]:
    """(encoded checksum, CRC or 0 for SHA256) of a file range, read ``STREAM_BLOCK`` at a time."""
    crc = 0
    sha = hashlib.sha256()
    end = offset + length
    while offset < end:
        block = read_at(fd, offset, min(STREAM_BLOCK, end - offset))
        if algo.combinable:
            crc = algo.update(block, crc)
        else:
            sha.update(block)
        offset += len(block)
    if algo.combinable:
        return algo.encode(crc), crc
    return base64.b64encode(sha.digest()).decode(), 0


class PartReader(io.RawIOBase):
    """One range of an open file as a seekable stream: the body of a streamed part. botocore
    reads it in small blocks (and seeks back to sign it or to retry), so only those blocks are in
    memory; ``len()`` is what is left to read (botocore's Content-Length)."""

    def __init__(self, fd: int, offset: int, length: int) -> None:
        super().__init__()
        self._fd = fd
        self._start = offset
        self._length = length
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def __len__(self) -> int:
        return self._length - self._pos

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._length}[whence]
        self._pos = min(max(0, base + offset), self._length)
        return self._pos

    def read(self, size: int | None = -1) -> bytes:
        left = self._length - self._pos
        n = left if size is None or size < 0 else min(size, left)
        if n <= 0:
            return b""
        data = read_at(self._fd, self._start + self._pos, n)
        self._pos += len(data)
        return data

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


class Throttle:
    """A token bucket shared by the workers of one process; a no-op without a rate."""

    def __init__(self, rate: float | None) -> None:
        self.rate = rate
        self._lock = threading.Lock()
        self._next = time.monotonic()

    def take(self, n: int) -> None:
        if not self.rate:
            return
        with self._lock:
            now = time.monotonic()
            start = max(now, self._next)
            self._next = start + n / self.rate
        if start > now:
            time.sleep(start - now)
