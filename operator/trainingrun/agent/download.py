"""Downloading checkpoint files from the bucket, in parallel and checksummed: parallel ranged
GETs written in place (``pwrite``), each range checksummed as it lands and combined, so no file is
read twice; a pack (``trainingrun.agent.packs``) in one GET, split into its files as it streams in.
SHA256 (for endpoints without CRC support) cannot be combined and costs one extra sequential read.
The workers, budget and cancelling are the upload's (``trainingrun.agent.transfer``).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import TypeVar, cast

from trainingrun.agent.packs import Overrun, Splitter, Target
from trainingrun.agent.parts import STREAM_BLOCK
from trainingrun.agent.transfer import Progress, Transfer, VerificationFailed
from trainingrun.checkpoint.local import create_for_writing, write_at
from trainingrun.storage.checksum import Algorithm, file_digest

# Ranges of one file in flight at once. Buffered writes to one file take its inode lock one at a
# time, so more ranges of the same file only wait (and spin) for it; the other workers take other
# files' ranges. s5cmd's default is 5 parts of a file at once.
RANGES_PER_FILE = 4

T = TypeVar("T")
R = TypeVar("R")


class Download(Transfer):
    """A transfer that downloads: the restore's."""

    def download_files(
        self,
        files: list[tuple[str, str, int, str]],
        algo_of: Callable[[str], Algorithm],
        progress: Progress,
        packs: dict[str, list[Target]] | None = None,
    ) -> None:
        """Downloads (key, local path, size, expected checksum) and the files packed in each
        pack (key -> its files' targets), and verifies each file; raises VerificationFailed
        naming the first file that does not match."""
        futures = [
            (key, self._pool.submit(self._download_pack, key, targets, algo_of(key), progress))
            for key, targets in (packs or {}).items()
        ] + [
            (
                key,
                self._pool.submit(
                    self._download, key, path, size, expected, algo_of(key), progress
                ),
            )
            for key, path, size, expected in sorted(files, key=lambda f: -f[2])
        ]
        self._gather(futures)

    def _download_pack(
        self, key: str, targets: list[Target], algo: Algorithm, progress: Progress
    ) -> str:
        """One pack in one GET, split into its files as it streams in."""
        self._check()
        split = Splitter(targets, algo)

        def sink(block: bytes | memoryview) -> None:
            split(block)
            progress.add(len(block))

        try:
            with self.budget.take(min(STREAM_BLOCK, split.span)):
                self.throttle.take(split.span)
                got = self.store.read_range(key, 0, split.span - 1, sink) if split.span else 0
        except Overrun as e:
            raise VerificationFailed(f"{key}: {e}") from e
        finally:
            problems = split.finish()
        if got != split.span:
            raise VerificationFailed(f"{key}: got {got} bytes, its files take {split.span}")
        if problems:
            raise VerificationFailed(f"{key}: {'; '.join(problems[:3])}")
        for _ in targets:
            progress.file_done()
        return key

    def _download(
        self, key: str, path: str, size: int, expected: str, algo: Algorithm, progress: Progress
    ) -> str:
        self._check()
        part = self.settings.range_size
        fd = create_for_writing(path)
        try:
            os.ftruncate(fd, size)
            ranges = [(off, min(part, size - off)) for off in range(0, size, part)]

            def fetch(r: tuple[int, int]) -> tuple[int, int]:
                offset, length = r
                self._check()
                crc = 0
                at = offset

                def sink(block: bytes | memoryview) -> None:
                    nonlocal crc, at
                    if at + len(block) > offset + length:
                        raise VerificationFailed(f"{key}: more bytes than asked at {at}")
                    write_at(fd, block, at)
                    if algo.combinable:
                        crc = algo.update(block, crc)
                    at += len(block)
                    progress.add(len(block))

                with self.budget.take(min(STREAM_BLOCK, length)):
                    self.throttle.take(length)
                    got = self.store.read_range(key, offset, offset + length - 1, sink)
                if got != length:
                    raise VerificationFailed(
                        f"{key}: got {got} bytes at offset {offset}, expected {length} "
                        f"(object shorter than its recorded {size} bytes)"
                    )
                return crc, length

            crcs = self._in_lanes(fetch, ranges)
        finally:
            os.close(fd)
        if algo.combinable:
            actual = algo.encode(algo.combine(crcs) if crcs else algo.of(b""))
        else:
            actual = file_digest(algo, path)
        if actual != expected:
            raise VerificationFailed(
                f"{key}: {algo.name} checksum {actual} does not match the recorded {expected}"
            )
        progress.file_done()
        return actual

    def _in_lanes(self, fn: Callable[[T], R], items: list[T]) -> list[R]:
        """``fn`` of each item, in order, at most ``RANGES_PER_FILE`` at a time on the parts'
        workers; after a failure no lane starts another item, and the first error is raised."""
        results: list[R | None] = [None] * len(items)
        todo = iter(range(len(items)))
        lock = threading.Lock()
        failed = threading.Event()

        def lane() -> None:
            while not failed.is_set():
                with lock:
                    i = next(todo, None)
                if i is None:
                    return
                try:
                    results[i] = fn(items[i])
                except BaseException:
                    failed.set()
                    raise

        lanes = [self._parts.submit(lane) for _ in range(min(RANGES_PER_FILE, len(items)))]
        self._gather([(str(n), done) for n, done in enumerate(lanes)])
        return cast(list[R], results)
