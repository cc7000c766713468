"""The commit protocol's writes (commit.take_fence, commit.Committer) against moto's in-memory
S3, which honours ``IfNoneMatch: *`` and ``IfMatch`` (412): real compare-and-swaps, no network.

Covers:

- take_fence(): creates manifest.json; the same (uid, attempt) again writes nothing; the next
  attempt and a new uid (the run created again) get fence + 1; an older attempt of the uid is
  StaleAttempt; a version-1 manifest becomes version 2 with its entries; racing takers get two
  epochs;
- try_commit(): Outcome.missing until every rank's part is there, then one entry of the epoch;
  a fence behind the epoch is raised; a committed step is Outcome.already and not replaced, also
  when its commit lands between our read and write; Fenced when a newer epoch holds the fence,
  also when it is taken between the read and the CAS (If-Match and If-None-Match); a concurrent
  commit is not lost; a CAS that always loses is StorageUnavailable; without conditional writes
  it writes and reads back; the Committer's epoch, rank and keys;
- retention and sweep(): dropped entries' objects go (not checkpoint-10's with checkpoint-1's,
  not run r10's with r1's), so do older epochs' uncommitted ones; a committed entry's (also a
  version-1 step's in an epoch-like folder), the own epoch's in flight and a newer epoch's stay;
- write_part(): its key; another writer's record refused; an identical record kept; another of
  an uncommitted step replaced; another of a step this epoch committed refused;
- abort_stale_uploads() over real multipart uploads: older epochs' and its own (epoch, rank)'s
  go; another rank's, a newer epoch's and another run's stay; detect_capabilities().
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.unit.fakes import BUCKET
from trainingrun.checkpoint import commit
from trainingrun.checkpoint.commit import Capabilities, Committer, Outcome, take_fence
from trainingrun.checkpoint.lookup import read_part, read_run_manifest
from trainingrun.checkpoint.manifest import (
    CHECKPOINT_MANIFEST,
    MANIFEST_VERSION,
    RUN_MANIFEST,
    CheckpointManifest,
    FileEntry,
    ManifestEntry,
    ManifestError,
    RunManifest,
    checkpoint_prefix,
    epoch_prefix,
    part_prefix,
)
from trainingrun.checkpoint.protocol import Fenced, StaleAttempt
from trainingrun.storage.checksum import CRC64NVME
from trainingrun.storage.opener import (
    Location,
    PreconditionFailed,
    S3Store,
    StorageRejected,
    StorageUnavailable,
    Store,
)

RUN = Location(BUCKET, "runs/ml/r1")
OTHER_RUN = Location(BUCKET, "runs/ml/r10")
UID = "uid-1"
CAS = Capabilities(CRC64NVME, verifies_checksums=True, conditional_writes=True)
PLAIN = Capabilities(CRC64NVME, verifies_checksums=False, conditional_writes=False)
OTHER_SUM = "AQEBAQEBAQE="


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The CAS backoff sleeps of the test's own thread, recorded instead of slept. The patch is
    of ``time.sleep`` itself: a thread another test left behind (a client still retrying)
    sleeps for real, rather than spin and fill the record."""
    slept: list[float] = []
    caller, real = threading.get_ident(), time.sleep

    def record(seconds: float) -> None:
        if threading.get_ident() == caller:
            slept.append(seconds)
        else:
            real(seconds)

    monkeypatch.setattr("trainingrun.checkpoint.commit.time.sleep", record)
    return slept


def _keys(client: Any) -> set[str]:
    return {o["Key"] for o in client.list_objects_v2(Bucket=BUCKET).get("Contents", [])}


def _uploads(client: Any) -> set[tuple[str, str]]:
    resp = client.list_multipart_uploads(Bucket=BUCKET)
    return {(u["Key"], u["UploadId"]) for u in resp.get("Uploads") or []}


def _manifest(store: Store) -> RunManifest:
    manifest = read_run_manifest(store, RUN)
    assert manifest is not None
    return manifest


def _steps(store: Store) -> list[int]:
    return [e.step for e in _manifest(store).entries]


def _part(
    c: Committer, step: int, checksum: str = "AAAAAAAAAAA=", created: str = "t0"
) -> CheckpointManifest:
    """The rank's part of ``step``: a file of its own (4 bytes) and one every rank writes."""
    files = [
        FileEntry(path=path, size=size, checksum_algorithm="CRC64NVME", checksum=crc)
        for path, size, crc in ((f"m-{c.rank}.bin", 4, checksum), ("sub/opt.pt", 3, "AQ=="))
    ]
    who = {"epoch": c.epoch, "rank": c.rank, "ranks": c.ranks}
    return CheckpointManifest(
        version=MANIFEST_VERSION, step=step, files=files, created=created, **who
    )


def _ready(c: Committer, *steps: int) -> list[str]:
    """Uploads the rank's files of each step and writes its part; returns their keys."""
    keys = []
    for step in steps:
        for name, data in ((f"m-{c.rank}.bin", b"data"), ("sub/opt.pt", b"opt")):
            keys.append(f"{c.data_prefix(step)}/{name}")
            c.store.put(keys[-1], data)
        c.write_part(_part(c, step))
        keys.append(f"{c.data_prefix(step)}/{CHECKPOINT_MANIFEST}")
    return keys


def _commit(c: Committer, step: int) -> Outcome:
    _ready(c, step)
    outcome = c.try_commit(step, attempt=c.epoch)
    assert outcome.committed, outcome
    return outcome


class RacingStore(S3Store):
    """Before our first write of manifest.json, ``rival`` runs (another writer's whole step)."""

    def __init__(self, client: Any, rival: Callable[[Store], object]) -> None:
        super().__init__(client, BUCKET)
        self.rival = rival
        self.manifest_writes: list[str] = []

    def put(self, key: str, data: bytes, **kwargs: Any) -> str:
        if key == RUN.key(RUN_MANIFEST):
            self.manifest_writes.append("if-match" if kwargs.get("if_match") else "if-none-match")
            if len(self.manifest_writes) == 1:
                self.rival(S3Store(self.client, BUCKET))
        return super().put(key, data, **kwargs)


# -- take_fence ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("takes", "epoch", "holder", "writes"),
    [
        pytest.param([(UID, 1)], 1, "uid-1/1", True, id="creates-the-manifest"),
        pytest.param([(UID, 1), (UID, 1)], 1, "uid-1/1", False, id="same-attempt-no-write"),
        pytest.param([(UID, 1), (UID, 2)], 2, "uid-1/2", True, id="next-attempt"),
        pytest.param([(UID, 1), (UID, 3)], 2, "uid-1/3", True, id="attempt-skipped"),
        pytest.param([(UID, 2), ("uid-2", 1)], 2, "uid-2/1", True, id="new-uid-same-name"),
        pytest.param([(UID, 2), (UID, 1)], None, "uid-1/2", False, id="older-attempt-stale"),
    ],
)
def test_take_fence(
    store: Store, takes: list[tuple[str, int]], epoch: int | None, holder: str, writes: bool
) -> None:
    *before, (uid, attempt) = takes
    for u, a in before:
        take_fence(store, RUN, u, a)
    written = store.get_with_etag(RUN.key(RUN_MANIFEST))

    if epoch is None:
        with pytest.raises(StaleAttempt, match=f"attempt 2 of this run .* attempt {attempt} "):
            take_fence(store, RUN, uid, attempt)
    else:
        manifest, got = take_fence(store, RUN, uid, attempt)
        assert got == manifest.fence == epoch
        assert manifest == _manifest(store)

    stored = _manifest(store)
    assert (stored.version, stored.fence_holder) == (MANIFEST_VERSION, holder)
    assert (store.get_with_etag(RUN.key(RUN_MANIFEST)) != written) is writes


def test_take_fence_upgrades_a_version_1_manifest(store: Store) -> None:
    entry = {"step": 5, "prefix": checkpoint_prefix(5), "committed": "t", "files": 1, "bytes": 4}
    store.put(RUN.key(RUN_MANIFEST), json.dumps({"version": 1, "entries": [entry]}).encode())

    manifest, epoch = take_fence(store, RUN, UID, 1)

    assert (epoch, manifest) == (1, _manifest(store))
    assert json.loads(store.get(RUN.key(RUN_MANIFEST)) or b"")["version"] == MANIFEST_VERSION
    assert manifest.entries == [ManifestEntry.model_validate(entry)]
    assert manifest.entries[0].part_prefixes == [checkpoint_prefix(5)]


def test_two_takers_racing_get_two_epochs(client: Any, sleeps: list[float]) -> None:
    rival: list[int] = []
    racing = RacingStore(client, lambda s: rival.append(take_fence(s, RUN, "uid-2", 1)[1]))

    _, epoch = take_fence(racing, RUN, UID, 1)

    assert (rival, epoch) == ([1], 2)
    assert racing.manifest_writes == ["if-none-match", "if-match"]
    assert len(sleeps) == 1


class CallLog(S3Store):
    """Records each call on manifest.json (``get``, ``put if-match <etag>``, ``put``...);
    ``conditions``: "honour" (moto's own), "ignore" (writes whatever the condition) or
    "refuse" (StorageRejected on a condition header, as an endpoint that does not know it)."""

    def __init__(self, client: Any, conditions: str = "honour") -> None:
        super().__init__(client, BUCKET)
        self.conditions = conditions
        self.calls: list[str] = []

    def get_with_etag(self, key: str) -> tuple[bytes, str] | None:
        if key == RUN.key(RUN_MANIFEST):
            self.calls.append("get")
        return super().get_with_etag(key)

    def get(self, key: str) -> bytes | None:
        if key == RUN.key(RUN_MANIFEST):
            self.calls.append("get")
        return super().get(key)

    def put(self, key: str, data: bytes, **kwargs: Any) -> str:
        if key != RUN.key(RUN_MANIFEST):
            return super().put(key, data, **kwargs)
        cond = kwargs.get("if_match") or ("*" if kwargs.get("if_none_match") else None)
        probe = kwargs.get("if_match") == commit.PROBE_ETAG
        self.calls.append("put" if cond is None else "put probe" if probe else "put cas")
        if cond is not None and self.conditions == "refuse":
            raise StorageRejected(f"{key}: the endpoint refused the request (NotImplemented)")
        if self.conditions == "ignore":
            kwargs = {}
        return super().put(key, data, **kwargs)


@pytest.mark.parametrize(
    ("conditions", "first", "second", "honoured"),
    [
        # Honoured: one probe (412, nothing written), then no read-back ever.
        pytest.param("honour", ["put probe", "put cas"], ["get", "put cas"], True, id="honoured"),
        # Ignored: the probe wrote the fence; every fence is read back; no second probe.
        pytest.param(
            "ignore", ["put probe", "get"], ["get", "put cas", "get"], False, id="ignored"
        ),
        # Refused: written plainly and read back; no second probe.
        pytest.param(
            "refuse",
            ["put probe", "put", "get"],
            ["get", "put cas", "put", "get"],
            False,
            id="refused",
        ),
    ],
)
def test_the_fence_reads_back_only_where_if_match_is_not_honoured(
    client: Any, conditions: str, first: list[str], second: list[str], honoured: bool
) -> None:
    take_fence(S3Store(client, BUCKET), RUN, UID, 1)  # a manifest to replace
    seen = S3Store(client, BUCKET).get_with_etag(RUN.key(RUN_MANIFEST))
    store, if_match = CallLog(client, conditions), commit.IfMatch()

    _, epoch = take_fence(store, RUN, UID, 2, seen, if_match)
    calls, store.calls = store.calls, []
    _, epoch3 = take_fence(store, RUN, UID, 3, None, if_match)

    assert (calls, store.calls) == (first, second)
    assert if_match.honoured is honoured
    assert (epoch, epoch3) == (2, 3)
    assert (_manifest(store).fence, _manifest(store).fence_holder) == (3, "uid-1/3")


def test_the_first_fence_of_a_run_is_read_back_and_probes_nothing(client: Any) -> None:
    """No manifest yet: a create-only write, read back; If-Match is not probed there."""
    store, if_match = CallLog(client), commit.IfMatch()

    take_fence(store, RUN, UID, 1, None, if_match)

    assert store.calls == ["get", "put cas", "get"]
    assert if_match.honoured is None


def test_a_fence_that_loses_the_race_where_if_match_is_honoured(
    client: Any, sleeps: list[float]
) -> None:
    """Known honoured: a rival's write between our read and the compare-and-swap is a 412, read
    again, and the fence goes over the rival's."""
    take_fence(S3Store(client, BUCKET), RUN, UID, 1)
    rival: list[int] = []
    racing = RacingStore(client, lambda s: rival.append(take_fence(s, RUN, "uid-2", 1)[1]))

    _, epoch = take_fence(racing, RUN, UID, 2, None, commit.IfMatch(honoured=True))

    assert (rival, epoch) == ([2], 3)
    assert racing.manifest_writes == ["if-match", "if-match"]
    assert _manifest(racing).fence_holder == "uid-1/2"


# -- Committer and try_commit ----------------------------------------------------------------


def test_committer_epoch_rank_and_keys(store: Store) -> None:
    c = Committer(store, RUN, CAS, 3, epoch=3, rank=1, ranks=2)

    assert c.data_prefix(7) == "runs/ml/r1/checkpoints/checkpoint-7/e3/r1"
    c.check_fence(None)
    c.check_fence(RunManifest(fence=3))
    with pytest.raises(Fenced, match="epoch 3 is fenced: epoch 4"):
        c.check_fence(RunManifest(fence=4, fence_holder="uid-1/4"))
    for epoch, rank, ranks in [(0, 0, 1), (1, 1, 1), (1, -1, 2)]:
        with pytest.raises(ValueError, match="must be >= 1"):
            Committer(store, RUN, CAS, 3, epoch, rank, ranks)


def test_try_commit_waits_for_every_rank(store: Store) -> None:
    take_fence(store, RUN, UID, 1)
    rank = [Committer(store, RUN, CAS, 3, epoch=1, rank=r, ranks=3) for r in range(3)]
    _ready(rank[0], 10)
    _ready(rank[2], 10)

    assert rank[0].try_commit(10, attempt=1) == Outcome(missing=(1,), manifest=_manifest(store))
    assert _steps(store) == []

    _ready(rank[1], 10)
    done = rank[2].try_commit(10, attempt=1)

    assert done.committed
    assert done.manifest == _manifest(store)
    e = _manifest(store).entries[0]
    assert (e.step, e.prefix, e.epoch, e.attempt, e.ranks) == (10, epoch_prefix(10, 1), 1, 1, 3)
    assert (e.files, e.bytes) == (6, 21)  # what the three parts hold in the bucket
    assert rank[1].try_commit(10, attempt=1) == Outcome(already=1, manifest=_manifest(store))


def test_a_committed_step_is_not_replaced_by_a_newer_epoch(store: Store) -> None:
    take_fence(store, RUN, UID, 1)
    _commit(Committer(store, RUN, CAS, 3, epoch=1), 10)
    before = _manifest(store).entries
    take_fence(store, RUN, UID, 2)
    newer = Committer(store, RUN, CAS, 3, epoch=2)
    _ready(newer, 10)

    outcome = newer.try_commit(10, attempt=2)

    assert (outcome.committed, outcome.already) == (False, 1)
    assert _manifest(store).entries == before


def test_a_step_committed_between_our_read_and_write_is_already(
    client: Any, sleeps: list[float]
) -> None:
    plain = S3Store(client, BUCKET)
    take_fence(plain, RUN, UID, 1)
    other = Committer(plain, RUN, CAS, 3, epoch=1, rank=1, ranks=2)
    _ready(other, 10)
    racing = RacingStore(client, lambda s: other.try_commit(10, attempt=1))
    ours = Committer(racing, RUN, CAS, 3, epoch=1, rank=0, ranks=2)
    _ready(ours, 10)

    outcome = ours.try_commit(10, attempt=1)

    assert (outcome.committed, outcome.already) == (False, 1)
    assert racing.manifest_writes == ["if-match"]
    assert _steps(plain) == [10]


@pytest.mark.parametrize(
    ("when", "writes"),
    [
        pytest.param("before-the-read", [], id="before-the-read"),
        pytest.param("before-the-cas", ["if-match"], id="between-read-and-if-match"),
        # No manifest.json yet (lost, or the epoch came from elsewhere): the rival's takes
        # create it and pass epoch 1 with its second attempt.
        pytest.param("before-the-create", ["if-none-match"], id="between-read-and-if-none-match"),
    ],
)
def test_an_older_epoch_is_fenced(
    client: Any, sleeps: list[float], when: str, writes: list[str]
) -> None:
    plain = S3Store(client, BUCKET)
    if when != "before-the-create":
        take_fence(plain, RUN, UID, 1)
    racing = RacingStore(client, lambda s: [take_fence(s, RUN, UID, a) for a in (1, 2)])
    old = Committer(racing, RUN, CAS, 3, epoch=1)
    _ready(old, 10)
    if when == "before-the-read":
        take_fence(plain, RUN, UID, 2)

    with pytest.raises(Fenced, match=r"epoch 1 is fenced: epoch 2 \(uid-1/2\)"):
        old.try_commit(10, attempt=1)
    assert racing.manifest_writes == writes
    assert (_manifest(plain).fence, _steps(plain)) == (2, [])


@pytest.mark.parametrize(
    ("existing", "first_write"),
    [
        pytest.param([5], "if-match", id="manifest-exists-if-match"),
        pytest.param([], "if-none-match", id="no-manifest-yet-if-none-match"),
    ],
)
def test_a_concurrent_commit_is_not_lost(
    client: Any, sleeps: list[float], existing: list[int], first_write: str
) -> None:
    plain = S3Store(client, BUCKET)
    rival = Committer(plain, RUN, CAS, keep=10, epoch=1)
    for step in existing:
        _commit(rival, step)
    _ready(rival, 7)
    racing = RacingStore(client, lambda s: rival.try_commit(7))

    _commit(Committer(racing, RUN, CAS, keep=10, epoch=1), 9)

    assert _steps(plain) == sorted([*existing, 7, 9])
    assert racing.manifest_writes == [first_write, "if-match"]
    assert len(sleeps) == 1


def test_a_cas_that_always_loses_gives_up(
    store: Store, sleeps: list[float], monkeypatch: pytest.MonkeyPatch
) -> None:
    c = Committer(store, RUN, CAS, keep=3, epoch=1)
    _commit(c, 1)
    _ready(c, 2)

    def always_lose(key: str, data: bytes, **kwargs: Any) -> str:
        raise PreconditionFailed(f"s3://{BUCKET}/{key}: condition not met")

    monkeypatch.setattr(store, "put", always_lose)

    with pytest.raises(StorageUnavailable, match="compare-and-swap"):
        c.try_commit(2)
    assert len(sleeps) == commit.CAS_ATTEMPTS
    assert _steps(S3Store(store.client, BUCKET)) == [1]


@pytest.mark.parametrize("caps", [CAS, PLAIN], ids=["cas", "write-and-read-back"])
def test_commits_with_no_fence_taken_raise_it(store: Store, caps: Capabilities) -> None:
    c = Committer(store, RUN, caps, keep=2, epoch=2)
    assert c.read() == (None, None)

    first = _commit(c, 1)
    _commit(c, 2)
    outcome = _commit(c, 3)

    stored = _manifest(store)
    assert (first.dropped, first.manifest is not None) == ((), True)
    assert (stored.fence, stored.fence_holder, _steps(store)) == (2, "", [2, 3])
    assert (outcome.manifest, [e.step for e in outcome.dropped]) == (stored, [1])


def test_read_refuses_a_corrupt_manifest(store: Store) -> None:
    store.put(RUN.key(RUN_MANIFEST), b'{"version": 2, "entries": [')

    with pytest.raises(ManifestError, match="not valid JSON"):
        Committer(store, RUN, CAS, keep=3, epoch=1).read()


# -- retention and sweep ---------------------------------------------------------------------


def test_retention_drops_the_oldest_and_sweeps_only_their_objects(
    store: Store, client: Any
) -> None:
    c = Committer(store, RUN, CAS, keep=2, epoch=1)
    keys = {step: _ready(c, step) for step in (1, 2, 3)}
    kept = set(keys[2] + keys[3] + _ready(c, 10))  # checkpoint-1 is checkpoint-10's prefix
    kept |= set(_ready(Committer(store, OTHER_RUN, CAS, keep=2, epoch=1), 1))  # r1 of r10

    assert c.try_commit(1).dropped == c.try_commit(2).dropped == ()
    outcome = c.try_commit(3)
    assert outcome.manifest is not None
    before = _keys(client)

    assert [e.step for e in outcome.dropped] == [1]
    assert _steps(store) == [2, 3]
    assert c.sweep(outcome.manifest, outcome.dropped) == len(keys[1]) == 3
    assert before - _keys(client) == set(keys[1])
    assert kept | {RUN.key(RUN_MANIFEST)} <= _keys(client)
    assert c.sweep(outcome.manifest) == 0
    # A step older than the `keep` committed ones is dropped by its own commit.
    assert [e.step for e in _commit(c, 0).dropped] == [0]
    assert _steps(store) == [2, 3]


def test_sweep_keeps_what_is_committed_or_in_flight(store: Store, client: Any) -> None:
    """A version-1 step 5 (with a folder named like an epoch), step 10 committed by epoch 1,
    step 20 left uncommitted by epoch 1; epoch 2 commits 30 while its rank 1 and epoch 3 write
    step 40; then retention drops the version-1 step."""
    v1 = [RUN.key(checkpoint_prefix(5), n) for n in ("model.bin", "e1/r0/x.bin", "MANIFEST.json")]
    entry = {"step": 5, "prefix": checkpoint_prefix(5), "committed": "t", "files": 2, "bytes": 8}
    for key in v1:
        store.put(key, b"v1")
    store.put(RUN.key(RUN_MANIFEST), json.dumps({"version": 1, "entries": [entry]}).encode())
    take_fence(store, RUN, UID, 1)
    first = Committer(store, RUN, CAS, keep=3, epoch=1)
    committed = _ready(first, 10)
    assert first.try_commit(10).committed
    stale = _ready(first, 20)
    take_fence(store, RUN, UID, 2)
    ours = Committer(store, RUN, CAS, keep=3, epoch=2)
    mine = _ready(ours, 30)
    in_flight = _ready(Committer(store, RUN, CAS, keep=3, epoch=2, rank=1, ranks=2), 40)
    newer = _ready(Committer(store, RUN, CAS, keep=3, epoch=3), 40)
    outcome = ours.try_commit(30)
    assert outcome.manifest is not None

    assert ours.sweep(outcome.manifest, outcome.dropped) == len(stale)
    assert not set(stale) & _keys(client)
    assert set(v1 + committed + mine + in_flight + newer) <= _keys(client)

    _ready(ours, 50)
    outcome = ours.try_commit(50)
    assert outcome.manifest is not None
    assert [e.step for e in outcome.dropped] == [5]
    assert ours.sweep(outcome.manifest, outcome.dropped) == len(v1)
    assert not set(v1) & _keys(client)


# -- write_part ------------------------------------------------------------------------------


def _stored(c: Committer, step: int) -> CheckpointManifest | None:
    return read_part(c.store, RUN, step, c.epoch, c.rank)


def test_part_is_written_under_its_epoch_and_rank(store: Store, client: Any) -> None:
    c = Committer(store, RUN, CAS, keep=3, epoch=2, rank=1, ranks=2)

    c.write_part(_part(c, 4))

    assert _stored(c, 4) == _part(c, 4)
    assert _keys(client) == {RUN.key(part_prefix(4, 2, 1), CHECKPOINT_MANIFEST)}
    for other in ({"epoch": 3}, {"rank": 0}, {"ranks": 3}):  # not this committer's
        with pytest.raises(ValueError, match="not this committer's epoch and rank"):
            c.write_part(_part(c, 5).model_copy(update=other))
    assert _stored(c, 5) is None


@pytest.mark.parametrize(
    ("existing", "committed", "stored"),
    [
        pytest.param(lambda c: _part(c, 4, created="t1"), True, "t1", id="identical-kept"),
        pytest.param(lambda c: _part(c, 4, OTHER_SUM), False, "ours", id="other-replaced"),
        pytest.param(lambda c: b"{half", False, "ours", id="unreadable-replaced"),
        pytest.param(lambda c: _part(c, 5), False, "ours", id="of-another-step-replaced"),
        pytest.param(lambda c: _part(c, 4, OTHER_SUM), True, None, id="committed-other-refused"),
    ],
)
def test_an_existing_part(
    store: Store,
    existing: Callable[[Committer], CheckpointManifest | bytes],
    committed: bool,
    stored: str | None,
) -> None:
    c = Committer(store, RUN, CAS, keep=3, epoch=1)
    body = existing(c)
    data = body if isinstance(body, bytes) else body.model_dump_json().encode()
    store.put(RUN.key(part_prefix(4, 1, 0), CHECKPOINT_MANIFEST), data)
    _commit(c, 3)  # another step is committed
    if committed:
        assert c.try_commit(4).committed
    ours = _part(c, 4, created="ours")

    if stored is None:
        with pytest.raises(PreconditionFailed, match="checkpoint-4 is committed by this epoch"):
            c.write_part(ours)
    else:
        c.write_part(ours)

    assert store.get(RUN.key(part_prefix(4, 1, 0), CHECKPOINT_MANIFEST)) == (
        data if stored != "ours" else ours.model_dump_json(indent=1).encode()
    )


# -- abort_stale_uploads, capability probe ---------------------------------------------------


def test_abort_stale_uploads_takes_older_epochs_and_its_own(store: Store, client: Any) -> None:
    def upload(run: Location, prefix: str) -> tuple[str, str]:
        key = run.key(prefix, "model.bin")
        return key, store.create_multipart(key, CRC64NVME)

    aborted = {
        upload(RUN, part_prefix(7, 1, 0)),
        upload(RUN, part_prefix(7, 1, 1)),
        upload(RUN, checkpoint_prefix(3)),  # version 1
        upload(RUN, part_prefix(7, 2, 1)),  # its own, before a restart
    }
    left = {
        upload(RUN, part_prefix(7, 2, 0)),  # another rank in flight
        upload(RUN, epoch_prefix(7, 2)),  # the own epoch, no rank
        upload(RUN, part_prefix(7, 3, 1)),  # a newer epoch
        upload(OTHER_RUN, part_prefix(7, 1, 1)),  # another run (r1 is r10's prefix)
    }
    c = Committer(store, RUN, CAS, keep=3, epoch=2, rank=1, ranks=2)

    assert c.abort_stale_uploads() == len(aborted)
    assert _uploads(client) == left
    assert c.abort_stale_uploads() == 0


def test_detect_capabilities_against_moto(store: Store, client: Any) -> None:
    before = _keys(client)

    caps = commit.detect_capabilities(store, RUN)

    assert caps.conditional_writes
    assert caps.algorithm is CRC64NVME
    assert _keys(client) == before
    assert "conditional writes yes" in caps.describe()
