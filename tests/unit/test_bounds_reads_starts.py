"""What a start costs when the bucket holds many broken committed checkpoints: a few reads and
one Event, not one of each per entry; and what a part record costs to parse at its cap.

Covers:

- a start against 1000 broken committed entries tries at most ``START_TRIES`` of them (a part
  record read and no more each), says so in one ``CheckpointSkipped`` Event naming the steps
  and how many older ones it did not try, records them in ``status.badCheckpoints`` and waits
  instead of starting from scratch; the next try reads the next ones, never the same again;
- once the untried ones run out the start resumes from the newest intact one (or starts from
  scratch when none is), and ``status.badCheckpoints`` keeps only steps the manifest names;
- a single skipped checkpoint is said as before: ``checkpoint <step> not used: <why>``;
- parsing a part record checks a pack's name once, not once per file it holds.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from tests.unit.builders import NAMESPACE, make_run
from tests.unit.fakes import Clock, FakeBucket, FakeKube
from trainingrun.checkpoint import manifest
from trainingrun.checkpoint.manifest import (
    CHECKPOINT_MANIFEST,
    MAX_FILES,
    PACK_DIR,
    RUN_MANIFEST,
    ManifestEntry,
    RunManifest,
    checkpoint_prefix,
    parse_checkpoint_manifest,
    parse_run_manifest,
)
from trainingrun.decide import reasons as R
from trainingrun.decide.naming import run_prefix
from trainingrun.decide.waits import MIN_RETRY_SECONDS
from trainingrun.operator.buckets import START_TRIES, RunStores
from trainingrun.operator.metrics import OperatorMetrics
from trainingrun.operator.reconciler import Reconciler
from trainingrun.operator.settings import OperatorSettings
from trainingrun.storage.opener import parse_uri

RUN = "r1"
FILES = {"model.safetensors": b"m" * 7}


class Counting(FakeBucket):
    """A bucket that counts the reads of committed checkpoints: part records and listings."""

    def __init__(self) -> None:
        super().__init__()
        self.part_reads: list[str] = []
        self.listings = 0

    def get(self, key: str) -> bytes | None:
        if key.endswith(CHECKPOINT_MANIFEST):
            self.part_reads.append(key)
        return super().get(key)

    def list_objects(self, prefix: str) -> Iterator[tuple[str, int]]:
        self.listings += 1
        return super().list_objects(prefix)


class Events:
    def __init__(self) -> None:
        self.posted: list[tuple[str, str, str]] = []

    def post(self, run: Any, type_: str, reason: str, message: str) -> None:
        self.posted.append((type_, reason, message))

    def of(self, reason: str) -> list[str]:
        return [m for _, r, m in self.posted if r == reason]


class Start:
    """A run in a cluster and a bucket in memory, and a Reconciler over them."""

    def __init__(self) -> None:
        self.clock, self.kube, self.bucket, self.events = Clock(), FakeKube(), Counting(), Events()
        builder = make_run(RUN)
        spec = builder.spec().model_dump(by_alias=True, exclude_none=True)
        meta = {"name": RUN, "namespace": NAMESPACE, "uid": builder.uid, "generation": 1}
        self.kube.add_run({"metadata": meta, "spec": spec})
        self.kube.clock = self.clock
        self.location = parse_uri(run_prefix(builder.ref()))
        stores = RunStores(self.kube, 30.0, self.bucket.open, monotonic=self.clock.monotonic)
        self.reconciler = Reconciler(
            self.kube,
            stores,
            self.events,
            OperatorMetrics(CollectorRegistry()),
            OperatorSettings(),
            now=self.clock.now,
            monotonic=self.clock.monotonic,
        )

    def commit_broken(self, steps: range) -> None:
        """Entries for ``steps`` in manifest.json whose part records are missing."""
        key = self.location.key(RUN_MANIFEST)
        raw = self.bucket.objects.get(key)
        before = parse_run_manifest(raw) if raw else RunManifest()
        added = [
            ManifestEntry(step=s, prefix=checkpoint_prefix(s), committed="t", files=1, bytes=7)
            for s in steps
        ]
        self.bucket.put(
            key, before.model_copy(update={"entries": [*before.entries, *added]}).to_json()
        )

    def reconcile(self) -> float | None:
        self.bucket.part_reads.clear()
        self.bucket.listings = 0
        self.events.posted.clear()
        return self.reconciler.reconcile(NAMESPACE, RUN)

    def status(self) -> dict[str, Any]:
        return copy.deepcopy(self.kube.status_of(NAMESPACE, RUN))


def test_a_start_tries_a_few_of_many_broken_checkpoints_and_says_it_once() -> None:
    s = Start()
    s.commit_broken(range(1, 1001))  # as many as manifest.json may list, all broken

    retry = s.reconcile()

    assert len(s.bucket.part_reads) <= START_TRIES
    assert s.bucket.listings == 0  # a missing part record ends a try before any listing
    [message] = s.events.of(R.CHECKPOINT_SKIPPED)
    assert message.startswith(f"{START_TRIES} checkpoints not used: checkpoint 1000: ")
    assert "; checkpoint 999: " in message and "; checkpoint 998: " in message
    assert message.endswith("; 997 older not tried yet: the next try reads them")
    assert len(message) <= 1024
    status = s.status()
    assert status["badCheckpoints"] == [1000, 999, 998]
    assert status["reason"] == R.CHECKPOINT_SKIPPED
    assert s.kube.creates == []  # not started from scratch while older ones wait
    assert retry is not None

    s.clock.advance(retry)
    s.reconcile()

    assert len(s.bucket.part_reads) <= START_TRIES
    assert all("checkpoint-1000/" not in k for k in s.bucket.part_reads)  # not read again
    assert s.status()["badCheckpoints"] == [1000, 999, 998, 997, 996, 995]
    assert len(s.events.of(R.CHECKPOINT_SKIPPED)) == 1


def test_the_tries_go_on_until_the_intact_one_is_found() -> None:
    s = Start()
    s.bucket.commit(s.location, 1, files=FILES)
    s.commit_broken(range(2, 9))  # 7 broken: three tries

    for _ in range(3):
        retry = s.reconcile()
        if s.kube.creates:
            break
        assert retry is not None
        s.clock.advance(retry)

    assert s.kube.creates == ["r1-1"]
    assert s.status()["resumeStep"] == 1
    assert sorted(s.status()["badCheckpoints"]) == list(range(2, 9))


def test_the_next_try_comes_soon_however_long_the_tries_have_gone_on() -> None:
    s = Start()
    s.commit_broken(range(1, 301))  # 100 tries of 3

    retries = []
    for _ in range(100):
        retry = s.reconcile()
        if s.kube.creates:
            break
        assert retry is not None
        retries.append(retry)
        s.clock.advance(retry)

    assert s.kube.creates == ["r1-1"]  # from scratch, every one of them tried
    assert set(retries) == {MIN_RETRY_SECONDS}, retries
    assert sum(retries) <= 100 * MIN_RETRY_SECONDS


def test_with_none_intact_the_start_is_from_scratch_once_all_are_tried() -> None:
    s = Start()
    s.commit_broken(range(1, 3))

    s.reconcile()

    assert s.kube.creates == ["r1-1"]
    assert s.status().get("resumeStep") is None
    [message] = s.events.of(R.CHECKPOINT_SKIPPED)
    assert message.startswith("2 checkpoints not used: checkpoint 2: ")
    assert "not tried" not in message


def test_one_skipped_checkpoint_is_said_as_before() -> None:
    s = Start()
    s.bucket.commit(s.location, 1, files=FILES)
    s.commit_broken(range(2, 3))

    s.reconcile()

    assert s.events.of(R.CHECKPOINT_SKIPPED) == [
        f"checkpoint 2 not used: {checkpoint_prefix(2)}{CHECKPOINT_MANIFEST} is missing"
    ]
    assert s.status()["resumeStep"] == 1


def _packed_part(files: int) -> bytes:
    """A part record of ``files`` files, all in one pack."""
    listed = [
        {
            "path": f"{i:06d}/model.bin",
            "size": 1,
            "checksum_algorithm": "CRC64NVME",
            "checksum": "AAAAAAAAAAA=",
            "pack": f"{PACK_DIR}/pack-0",
            "offset": i,
        }
        for i in range(files)
    ]
    body = {"version": 3, "step": 1, "files": listed, "created": "t", "epoch": 1, "ranks": 1}
    return json.dumps(body, indent=1).encode()


def test_a_pack_name_is_checked_once_not_once_per_file(monkeypatch: pytest.MonkeyPatch) -> None:
    """The path checks were half of a part record's parse: at MAX_FILES files in packs, ~100 ms
    of CPU under the GIL, twice per file."""
    checked: list[str] = []
    check = manifest.safe_relative_path

    def counted(path: str) -> str:
        checked.append(path)
        return check(path)

    monkeypatch.setattr(manifest, "safe_relative_path", counted)

    part = parse_checkpoint_manifest(_packed_part(MAX_FILES), 1, 1, 0)

    assert len(part.files) == MAX_FILES
    assert len(checked) <= MAX_FILES + 1
