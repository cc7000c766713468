"""The sync sidecar's limits: memory in flight, access denied, and SIGTERM during start-up.

Covers:

- parts.plan_parts with the default settings for files of 1 GiB, 160 GiB, 300 GiB and 5 TiB:
  the bytes in memory stay within the 256 MiB budget, the parts within S3's 10,000 and they cover
  the file; parts grow past 160 GiB, and are streamed once fewer than four would fit;
- an upload whose parts grew (``MAX_PARTS`` made small): the store never has more part bytes in
  flight at once than the budget, and still more than one part;
- a streamed upload through boto3 against moto: the object is the file bit for bit, its
  CRC64NVME and SHA256 are the file's, and the budget's peak is blocks, not parts;
- ByteBudget: a request larger than the whole budget runs, alone; PartReader: len, seek, tell
  and read over one range of a file, as botocore uses them;
- AccessDeniedWatch with a fake clock: expires after the limit of nothing but access denied,
  any other outcome starts it again; the Sync loop against a store that only answers access
  denied exits 1 after the limit, with the termination message written and logged;
- StopRequest: a SIGTERM recorded before the loop exists reaches it when it attaches;
  ``sync.main`` with a SIGTERM already received commits the complete checkpoint waiting on disk
  and returns 0.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any, cast

import pytest

from tests.unit.fakes import BUCKET
from trainingrun.agent import parts, sync
from trainingrun.agent.parts import MAX_PARTS, ByteBudget, PartReader, plan_parts
from trainingrun.agent.sidecar import AccessDeniedWatch, Metrics
from trainingrun.agent.stopsignal import StopRequest
from trainingrun.agent.sync import Sync, SyncSettings
from trainingrun.agent.transfer import MiB, Progress, Transfer, TransferSettings
from trainingrun.checkpoint import local
from trainingrun.checkpoint.local import WRITE_BLOCK, write_at
from trainingrun.checkpoint.lookup import read_run_manifest
from trainingrun.decide.protection import ACCESS_DENIED_MESSAGE
from trainingrun.storage.checksum import CRC64NVME, SHA256, Algorithm, file_digest
from trainingrun.storage.opener import (
    Location,
    S3Store,
    StorageAccessDenied,
    StorageUnavailable,
    Store,
)

GiB = 1 << 30
TiB = 1 << 40
RUN = Location(BUCKET, "runs/ml/r1")


# -- the part plan -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("size", "streamed"),
    [
        pytest.param(1 * GiB, False, id="1GiB"),
        pytest.param(160 * GiB, False, id="160GiB"),
        pytest.param(300 * GiB, False, id="300GiB"),
        pytest.param(5 * TiB, True, id="5TiB"),
    ],
)
def test_in_flight_bytes_stay_within_the_budget(size: int, streamed: bool) -> None:
    s = TransferSettings()
    plan = plan_parts(size, s.part_size, s.memory_budget, s.concurrency)

    assert plan.in_flight <= s.memory_budget == 256 * MiB
    assert plan.parts <= MAX_PARTS
    assert plan.parts * plan.part_size >= size
    assert plan.streamed is streamed
    assert plan.concurrency >= 1
    ranges = plan.ranges()
    assert len(ranges) == plan.parts
    assert sum(length for _, _, length in ranges) == size
    assert ranges[-1][1] + ranges[-1][2] == size


def test_parts_grow_and_concurrency_shrinks_past_160_gib() -> None:
    s = TransferSettings()
    small, large = (
        plan_parts(size, s.part_size, s.memory_budget, s.concurrency)
        for size in (100 * GiB, 300 * GiB)
    )
    assert (small.part_size, small.concurrency) == (16 * MiB, 16)
    assert large.part_size > 30 * MiB
    assert large.concurrency == s.memory_budget // large.part_size == 8


# -- uploads within the budget ---------------------------------------------------------------


class CountingStore:
    """The multipart calls of ``Store``; counts the part bytes in flight at once."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.peak = 0
        self.most_parts = 0
        self._parts = 0
        self._lock = threading.Lock()

    def create_multipart(self, key: str, algo: Algorithm) -> str:
        return "upload-1"

    def upload_part(
        self, key: str, upload_id: str, number: int, data: bytes, algo: Algorithm, checksum: str
    ) -> dict[str, Any]:
        held = len(data)
        with self._lock:
            self.in_flight += held
            self._parts += 1
            self.peak = max(self.peak, self.in_flight)
            self.most_parts = max(self.most_parts, self._parts)
        time.sleep(0.05)  # long enough for every worker free to start its own part
        with self._lock:
            self.in_flight -= held
            self._parts -= 1
        return {"PartNumber": number, "ETag": f'"{number}"', algo.header: checksum}

    def complete_multipart(self, *args: Any) -> None:
        del args

    def abort_multipart(self, key: str, upload_id: str) -> None:
        del key, upload_id


def _file(path: Path, size: int) -> str:
    path.write_bytes(os.urandom(size))
    return str(path)


def test_an_upload_whose_parts_grew_keeps_its_bytes_in_flight_within_the_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 8 parts at most: a 12 MiB file gets parts of 1.5 MiB instead of 256 KiB, as a 300 GiB
    # file gets parts of 30 MiB instead of 16 MiB.
    monkeypatch.setattr(parts, "MAX_PARTS", 8)
    budget = 8 * MiB
    settings = TransferSettings(
        part_size=256 << 10, multipart_threshold=256 << 10, concurrency=16, memory_budget=budget
    )
    path = _file(tmp_path / "model.bin", 12 * MiB)
    store = CountingStore()
    transfer = Transfer(cast(Store, store), settings)
    try:
        sums = transfer.upload_files([(path, "k")], CRC64NVME, Progress("t", 12 * MiB, 1))
    finally:
        transfer.close()

    assert sums == {"k": file_digest(CRC64NVME, path)}
    assert store.peak <= budget
    assert store.most_parts == budget // (3 * MiB // 2) == 5  # not one at a time either


@pytest.mark.parametrize("algo", [CRC64NVME, SHA256], ids=lambda a: a.name)
def test_parts_larger_than_the_budget_allows_are_streamed_from_the_file(
    client: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, algo: Algorithm
) -> None:
    # 3 parts at most: a 30 MiB file gets parts of 10 MiB, more than the 8 MiB budget holds,
    # as a 5 TiB file gets parts of 525 MiB.
    monkeypatch.setattr(parts, "MAX_PARTS", 3)
    monkeypatch.setattr(parts, "STREAM_BLOCK", 1 * MiB)
    budget = 8 * MiB
    settings = TransferSettings(
        part_size=5 * MiB, multipart_threshold=5 * MiB, concurrency=4, memory_budget=budget
    )
    path = _file(tmp_path / "model.bin", 30 * MiB)
    transfer = Transfer(S3Store(client, BUCKET), settings)
    try:
        assert transfer.plan(30 * MiB).streamed
        sums = transfer.upload_files([(path, "k")], algo, Progress("t", 30 * MiB, 1))
    finally:
        transfer.close()
    body = client.get_object(Bucket=BUCKET, Key="k")["Body"].read()

    assert body == Path(path).read_bytes()
    assert sums == {"k": file_digest(algo, path)}
    assert transfer.budget.peak <= 3 * MiB  # three blocks, not three 10 MiB parts


def test_a_request_larger_than_the_budget_runs_alone() -> None:
    budget = ByteBudget(10)
    order: list[str] = []
    with budget.take(4):
        waiter = threading.Thread(target=lambda: _take(budget, 30, order))
        waiter.start()
        time.sleep(0.1)
        order.append("small done")
    waiter.join(5)
    assert order == ["small done", "large ran"]
    assert budget.peak == 30 and budget.used == 0


def _take(budget: ByteBudget, n: int, order: list[str]) -> None:
    with budget.take(n):
        order.append("large ran")


def test_part_reader_is_one_range_of_the_file(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(bytes(range(100)))
    fd = os.open(path, os.O_RDONLY)
    try:
        reader = PartReader(fd, 10, 20)
        assert len(reader) == 20
        assert reader.read(5) == bytes(range(10, 15))
        assert (reader.tell(), len(reader)) == (5, 15)
        assert reader.read() == bytes(range(15, 30))
        assert reader.read(1) == b""
        assert reader.seek(0) == 0  # botocore rewinds to sign the body or to retry
        assert reader.read(1000) == bytes(range(10, 30))
        assert reader.seek(-4, os.SEEK_END) == 16
        assert reader.read() == bytes(range(26, 30))
    finally:
        os.close(fd)


@pytest.mark.parametrize("short", [False, True], ids=["whole", "short-writes"])
@pytest.mark.parametrize("size", [1, WRITE_BLOCK, WRITE_BLOCK + 1, 2 * WRITE_BLOCK + 3])
def test_write_at_writes_the_whole_block_no_more_than_write_block_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: int, short: bool
) -> None:
    data = os.urandom(size)
    offset = 3 * WRITE_BLOCK + 7
    calls: list[tuple[int, int]] = []
    real = os.pwrite

    def pwrite(fd: int, buf: Any, at: int) -> int:
        calls.append((len(buf), at))
        # A short write (allowed by pwrite) is picked up where it stopped.
        return real(fd, memoryview(buf)[: max(1, len(buf) // 2)] if short else buf, at)

    monkeypatch.setattr(local.os, "pwrite", pwrite)
    path = tmp_path / "f"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        write_at(fd, memoryview(data), offset)
    finally:
        os.close(fd)
    assert path.read_bytes()[offset:] == data
    assert max(n for n, _ in calls) <= WRITE_BLOCK
    assert len(calls) >= -(-size // WRITE_BLOCK)


# -- access denied ---------------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


DENIED = StorageAccessDenied("s3://ckpt/runs/ml/r1/manifest.json: access denied")


def test_access_denied_expires_after_the_limit_of_nothing_else() -> None:
    clock = FakeClock()
    watch = AccessDeniedWatch(300, clock)
    assert not watch.expired(DENIED)
    clock.now = 299
    assert not watch.expired(DENIED)
    clock.now = 300
    assert watch.expired(DENIED)


@pytest.mark.parametrize(
    "between",
    [
        pytest.param("success", id="a-pass-that-worked"),
        pytest.param(StorageUnavailable("endpoint down"), id="another-failure"),
    ],
)
def test_anything_but_access_denied_starts_the_watch_again(between: Any) -> None:
    clock = FakeClock()
    watch = AccessDeniedWatch(300, clock)
    watch.expired(DENIED)
    clock.now = 200
    if between == "success":
        watch.clear()
    else:
        assert not watch.expired(between)
    clock.now = 350
    assert not watch.expired(DENIED)
    clock.now = 649
    assert not watch.expired(DENIED)
    clock.now = 650
    assert watch.expired(DENIED)


class DeniedStore:
    """Every S3 call answers access denied, as after the sidecar's key was revoked."""

    def __getattr__(self, name: str) -> Any:
        def denied(*args: Any, **kwargs: Any) -> Any:
            raise DENIED

        return denied


def test_the_sidecar_exits_after_access_denied_for_the_limit(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    message_file = tmp_path / "termination-log"
    settings = SyncSettings(
        checkpoint_dir=tmp_path / "ck",
        run=RUN,
        epoch=1,
        access_denied_seconds=0.3,
        termination_log=message_file,
    )
    sidecar = Sync(cast(Store, DeniedStore()), settings)
    result: list[int] = []
    loop = threading.Thread(target=lambda: result.append(sidecar.run()), daemon=True)
    with caplog.at_level(logging.ERROR, logger="trainingrun.agent.sync"):
        loop.start()
        loop.join(10)
        if loop.is_alive():  # before the fix it retried forever: stop it to fail cleanly
            sidecar.stopping.set()
            sidecar.wake.set()
            loop.join(10)

    assert result == [1]
    message = message_file.read_text()
    assert message.startswith(ACCESS_DENIED_MESSAGE)
    assert "access denied" in message and "manifest.json" in message
    assert any(r.getMessage() == message for r in caplog.records)


# -- SIGTERM during start-up ---------------------------------------------------------------------


def test_a_sigterm_recorded_before_the_loop_exists_reaches_it() -> None:
    request = StopRequest()
    request.on_signal(signal.SIGTERM, None)  # during start-up: nobody listens yet
    heard: list[int] = []
    request.attach(lambda signum, frame: heard.append(signum))
    request.on_signal(signal.SIGTERM, None)
    assert heard == [signal.SIGTERM, signal.SIGTERM]


@pytest.mark.timeout(60)  # without the request reaching the loop, it would never stop
def test_a_sidecar_stopped_during_start_up_still_commits_the_waiting_checkpoint(
    store: Store, tmp_path: Path
) -> None:
    folder = tmp_path / "ck"
    ckpt = folder / "checkpoint-40"
    ckpt.mkdir(parents=True)
    (ckpt / "model.safetensors").write_bytes(b"w" * 4096)
    (ckpt / "trainer_state.json").write_text('{"global_step": 40}')
    local.mark_complete(ckpt)
    request = StopRequest()
    request.on_signal(signal.SIGTERM, None)  # before the sidecar's start-up finished
    settings = SyncSettings(checkpoint_dir=folder, run=RUN, quiet_seconds=600, drain_seconds=30)

    code = sync.main(store, settings, Metrics(), stop=request)

    manifest = read_run_manifest(store, RUN)
    assert code == 0
    assert manifest is not None and [e.step for e in manifest.entries] == [40]
