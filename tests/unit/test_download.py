"""The restore's ranged downloads (``trainingrun.agent.download``) over an in-memory store and a
real
folder.

Covers:

- a file of many ranges has at most ``RANGES_PER_FILE`` of them in flight at once, and that many
  when it has enough; the ranges land in place and the file verifies;
- the other workers take the other files' ranges meanwhile;
- after a range fails, no lane starts another range of that file, and the error is raised;
- files are created one at a time in a folder (two folders side by side) while their downloads
  run at once: threads creating files in one folder together spin on its lock in the kernel, a
  CPU each; a file already there is emptied first.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from trainingrun.agent.download import RANGES_PER_FILE, Download
from trainingrun.agent.transfer import Progress, TransferSettings
from trainingrun.checkpoint import local
from trainingrun.storage.checksum import CRC64NVME, digest

RANGE = 64 << 10


class RangeStore:
    """Objects in memory, a ranged GET that counts the ranges in flight per object; the first
    ``meet`` ranges wait for one another (proof that many ran at once); ``fail`` raises at that
    range's offset, after which the others wait ``linger`` seconds before they end."""

    def __init__(self, objects: dict[str, bytes], meet: int = 1, fail: int | None = None) -> None:
        self.objects = objects
        self.fail = fail
        self.lock = threading.Lock()
        self.in_flight: dict[str, int] = {}
        self.peak: dict[str, int] = {}
        self.total_peak = 0
        self.started: list[tuple[str, int]] = []
        self.barrier = threading.Barrier(meet)
        self.to_meet = meet
        self.failed = threading.Event()

    def read_range(
        self, key: str, start: int, end: int, sink: Callable[[bytes], None], chunk: int = 0
    ) -> int:
        with self.lock:
            self.started.append((key, start))
            self.in_flight[key] = self.in_flight.get(key, 0) + 1
            self.peak[key] = max(self.peak.get(key, 0), self.in_flight[key])
            self.total_peak = max(self.total_peak, sum(self.in_flight.values()))
            meet = self.to_meet > 0
            self.to_meet -= 1
        try:
            if meet:
                self.barrier.wait(timeout=10)
            if self.fail is not None:
                if start == self.fail * RANGE:
                    self.failed.set()
                    raise OSError("connection reset")
                self.failed.wait(timeout=10)
                time.sleep(0.2)
            else:
                time.sleep(0.005)
            block = self.objects[key][start : end + 1]
            sink(block)
            return len(block)
        finally:
            with self.lock:
                self.in_flight[key] -= 1


def download(
    store: RangeStore, tmp_path: Path, sizes: dict[str, int], concurrency: int = 8
) -> dict[str, bytes]:
    """Downloads every object of ``store`` into ``tmp_path``; returns what landed."""
    transfer = Download(
        store,  # type: ignore[arg-type]  # only read_range is used
        TransferSettings(range_size=RANGE, concurrency=concurrency),
    )
    files = [
        (key, str(tmp_path / key), size, digest(CRC64NVME, store.objects[key]))
        for key, size in sizes.items()
    ]
    progress = Progress("restore", sum(sizes.values()), len(sizes))
    try:
        transfer.download_files(files, lambda _: CRC64NVME, progress)
    finally:
        transfer.close()
    return {key: (tmp_path / key).read_bytes() for key in sizes}


@pytest.mark.parametrize("ranges", [1, 3, RANGES_PER_FILE, 9])
def test_a_file_has_at_most_ranges_per_file_in_flight_and_lands_whole(
    tmp_path: Path, ranges: int
) -> None:
    data = bytes(i % 251 for i in range(ranges * RANGE - 17))
    store = RangeStore({"model.safetensors": data}, meet=min(ranges, RANGES_PER_FILE))
    landed = download(store, tmp_path, {"model.safetensors": len(data)})
    assert landed == {"model.safetensors": data}
    assert store.peak["model.safetensors"] == min(ranges, RANGES_PER_FILE)
    assert sorted(start for _, start in store.started) == [i * RANGE for i in range(ranges)]


def test_other_files_ranges_run_beside_a_files_lanes(tmp_path: Path) -> None:
    objects = {name: bytes([n]) * (9 * RANGE) for n, name in enumerate(["a.bin", "b.bin"])}
    # Both files' lanes at once: twice the lanes of one file meet.
    store = RangeStore(objects, meet=2 * RANGES_PER_FILE)
    landed = download(store, tmp_path, {k: len(v) for k, v in objects.items()}, concurrency=16)
    assert landed == objects
    assert max(store.peak.values()) == RANGES_PER_FILE
    assert store.total_peak == 2 * RANGES_PER_FILE


def test_after_a_range_fails_no_lane_starts_another(tmp_path: Path) -> None:
    data = b"x" * (12 * RANGE)
    store = RangeStore({"optimizer.pt": data}, fail=0)
    with pytest.raises(OSError, match="connection reset"):
        download(store, tmp_path, {"optimizer.pt": len(data)})
    # The failing range and the ones already in flight beside it; none of the 8 after them.
    assert len(store.started) <= RANGES_PER_FILE


@pytest.mark.parametrize("folders", [1, 2])
def test_files_are_created_one_at_a_time_per_folder_while_their_downloads_run_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, folders: int
) -> None:
    objects = {f"rank-{n % folders}/adapter-{n}.bin": bytes([n]) * 1000 for n in range(8)}
    for f in range(folders):
        (tmp_path / f"rank-{f}").mkdir()
    (tmp_path / "rank-0/adapter-0.bin").write_bytes(b"left by an earlier attempt" * 100)
    creating = {"now": 0, "peak": 0}
    lock = threading.Lock()
    real = os.open

    def slow_open(path: str, flags: int, mode: int = 0o777) -> int:
        with lock:
            creating["now"] += 1
            creating["peak"] = max(creating["peak"], creating["now"])
        try:
            time.sleep(0.05)  # a slow creation, as ext4's search for a free inode can be
            return real(path, flags, mode)
        finally:
            with lock:
                creating["now"] -= 1

    monkeypatch.setattr(local.os, "open", slow_open)
    # All 8 files' single ranges meet in flight: the downloads did run at once.
    store = RangeStore(objects, meet=8)
    landed = download(store, tmp_path, {k: len(v) for k, v in objects.items()}, concurrency=8)
    assert landed == objects
    assert store.total_peak == 8
    # One creation at a time in a folder; folders side by side, as the kernel allows.
    assert creating["peak"] == folders


def test_create_for_writing_creates_or_empties(tmp_path: Path) -> None:
    made, kept = tmp_path / "new.bin", tmp_path / "old.bin"
    kept.write_bytes(b"x" * 100)
    for path in (made, kept):
        fd = local.create_for_writing(str(path))
        try:
            os.write(fd, b"ab")
        finally:
            os.close(fd)
        assert path.read_bytes() == b"ab"
