"""The sidecar's commit protocol (commit.Committer) against moto's in-memory S3.

moto 5 honours ``IfNoneMatch: *`` and ``IfMatch`` on put_object (412 PreconditionFailed), so the
compare-and-swap runs against real conditional-write semantics here; no network.

Covers:

- commit() to a bucket without manifest.json creates it; later commits add entries; retention
  (keep) drops the oldest and returns them; delete_checkpoint_objects() then deletes the objects
  of the dropped steps only (not checkpoint-10 when dropping checkpoint-1, not another run's);
- a concurrent writer that commits between our read and our write (both when manifest.json
  exists, If-Match, and when it does not yet, If-None-Match): our first CAS gets 412, the retry
  re-reads, and neither entry is lost;
- a CAS that always loses ends in StorageUnavailable after CAS_ATTEMPTS tries;
- an endpoint without conditional writes: commit writes and reads back;
- write_checkpoint_manifest(): creates it; an identical existing MANIFEST.json (creation time
  aside) is kept; a different or unreadable one of an uncommitted step is replaced; a different
  one of a committed step raises PreconditionFailed naming the step;
- read(): None without manifest.json, ManifestError for a corrupt one;
- detect_capabilities() against moto: conditional writes detected, the probe objects removed.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from moto import mock_aws

from trainingrun import commit
from trainingrun.checksum import CRC64NVME
from trainingrun.commit import Capabilities, Committer
from trainingrun.manifest import (
    CHECKPOINT_MANIFEST,
    MANIFEST_VERSION,
    RUN_MANIFEST,
    CheckpointManifest,
    FileEntry,
    ManifestEntry,
    ManifestError,
    checkpoint_prefix,
    parse_checkpoint_manifest,
    parse_run_manifest,
)
from trainingrun.storage import (
    Location,
    PreconditionFailed,
    StorageUnavailable,
    Store,
    make_client,
)

BUCKET = "ckpt"
RUN = Location(BUCKET, "runs/ml/r1")
OTHER_RUN = Location(BUCKET, "runs/ml/r10")
CAS = Capabilities(CRC64NVME, verifies_checksums=True, conditional_writes=True)


@pytest.fixture(scope="module")
def moto_client() -> Iterator[Any]:
    """One in-memory S3 and client for the module (making a client takes about a second)."""
    with pytest.MonkeyPatch.context() as mp:
        for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_CONFIG_FILE"):
            mp.delenv(name, raising=False)
        mp.setenv("AWS_ACCESS_KEY_ID", "testing")
        mp.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        mp.setenv("AWS_SESSION_TOKEN", "testing")
        with mock_aws():
            c = make_client(region="us-east-1")
            c.create_bucket(Bucket=BUCKET)
            yield c


@pytest.fixture
def client(moto_client: Any) -> Any:
    """The module's client over an empty bucket."""
    keys = _keys(moto_client)
    if keys:
        moto_client.delete_objects(
            Bucket=BUCKET, Delete={"Objects": [{"Key": k} for k in sorted(keys)]}
        )
    return moto_client


@pytest.fixture
def store(client: Any) -> Store:
    return Store(client, BUCKET)


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The CAS backoff sleeps, recorded instead of slept."""
    slept: list[float] = []
    monkeypatch.setattr(commit.time, "sleep", slept.append)
    return slept


def _entry(step: int) -> ManifestEntry:
    return ManifestEntry(
        step=step, prefix=checkpoint_prefix(step), committed=f"t{step}", files=1, bytes=4
    )


def _steps(store: Store, run: Location = RUN) -> list[int]:
    data = store.get(run.key(RUN_MANIFEST))
    assert data is not None
    return [e.step for e in parse_run_manifest(data).entries]


def _put_checkpoint_objects(store: Store, run: Location, step: int) -> list[str]:
    keys = [run.key(checkpoint_prefix(step), n) for n in ("model.bin", "sub/opt.pt")]
    for key in keys:
        store.put(key, b"data")
    return keys


def _keys(client: Any) -> set[str]:
    resp = client.list_objects_v2(Bucket=BUCKET)
    return {o["Key"] for o in resp.get("Contents", [])}


# -- commit and retention ------------------------------------------------------------------


def test_first_commit_creates_the_manifest(store: Store) -> None:
    committer = Committer(store, RUN, CAS, keep=3)
    assert committer.read() == (None, None)

    dropped = committer.commit(_entry(100))

    assert dropped == []
    assert _steps(store) == [100]
    manifest, etag = committer.read()
    assert manifest is not None
    assert manifest.latest == _entry(100)
    assert etag


def test_retention_drops_the_oldest_and_deletes_only_their_objects(
    store: Store, client: Any
) -> None:
    committer = Committer(store, RUN, CAS, keep=2)
    step_keys = {step: _put_checkpoint_objects(store, RUN, step) for step in (1, 2, 3)}
    kept_keys = set(step_keys[2] + step_keys[3])
    kept_keys |= set(_put_checkpoint_objects(store, RUN, 10))  # checkpoint-1 is its prefix
    kept_keys |= set(_put_checkpoint_objects(store, OTHER_RUN, 1))  # r1 is r10's prefix

    assert committer.commit(_entry(1)) == []
    assert committer.commit(_entry(2)) == []
    dropped = committer.commit(_entry(3))

    assert [e.step for e in dropped] == [1]
    assert _steps(store) == [2, 3]
    before = _keys(client)
    deleted = committer.delete_checkpoint_objects([e.step for e in dropped])
    after = _keys(client)
    assert deleted == 2
    assert before - after == set(step_keys[1])
    assert kept_keys <= after
    assert RUN.key(RUN_MANIFEST) in after
    assert committer.delete_checkpoint_objects([]) == 0


def test_committing_an_older_step_past_retention_drops_it_at_once(store: Store) -> None:
    committer = Committer(store, RUN, CAS, keep=2)
    committer.commit(_entry(20))
    committer.commit(_entry(30))

    dropped = committer.commit(_entry(10))

    assert [e.step for e in dropped] == [10]
    assert _steps(store) == [20, 30]


class RacingStore(Store):
    """Before our first conditional write of manifest.json, another sync commits ``step``."""

    def __init__(self, client: Any, rival_step: int) -> None:
        super().__init__(client, BUCKET)
        self.rival = Committer(Store(client, BUCKET), RUN, CAS, keep=10)
        self.rival_step = rival_step
        self.manifest_writes: list[str] = []

    def put(self, key: str, data: bytes, **kwargs: Any) -> str:
        if key == RUN.key(RUN_MANIFEST):
            kind = "if-match" if kwargs.get("if_match") else "if-none-match"
            self.manifest_writes.append(kind)
            if len(self.manifest_writes) == 1:
                self.rival.commit(_entry(self.rival_step))
        return super().put(key, data, **kwargs)


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
    racing = RacingStore(client, rival_step=7)
    for step in existing:
        Committer(Store(client, BUCKET), RUN, CAS, keep=10).commit(_entry(step))
    committer = Committer(racing, RUN, CAS, keep=10)

    committer.commit(_entry(9))

    assert _steps(racing) == sorted([*existing, 7, 9])
    assert racing.manifest_writes == [first_write, "if-match"]
    assert len(sleeps) == 1


def test_a_cas_that_always_loses_gives_up(
    store: Store, sleeps: list[float], monkeypatch: pytest.MonkeyPatch
) -> None:
    committer = Committer(store, RUN, CAS, keep=3)
    committer.commit(_entry(1))

    def always_lose(key: str, data: bytes, **kwargs: Any) -> str:
        raise PreconditionFailed(f"s3://{BUCKET}/{key}: condition not met")

    monkeypatch.setattr(store, "put", always_lose)

    with pytest.raises(StorageUnavailable, match="compare-and-swap"):
        committer.commit(_entry(2))
    assert len(sleeps) == commit.CAS_ATTEMPTS
    assert _steps(Store(store.client, BUCKET)) == [1]


def test_commit_without_conditional_writes_reads_back(store: Store) -> None:
    plain = Capabilities(CRC64NVME, verifies_checksums=False, conditional_writes=False)
    committer = Committer(store, RUN, plain, keep=2)

    committer.commit(_entry(1))
    committer.commit(_entry(2))
    dropped = committer.commit(_entry(3))

    assert _steps(store) == [2, 3]
    assert [e.step for e in dropped] == [1]


def test_read_refuses_a_corrupt_manifest(store: Store) -> None:
    store.put(RUN.key(RUN_MANIFEST), b'{"version": 1, "entries": [')

    with pytest.raises(ManifestError, match="not valid JSON"):
        Committer(store, RUN, CAS, keep=3).read()


# -- checkpoint MANIFEST.json ----------------------------------------------------------------


def _ckpt(step: int, checksum: str = "AAAAAAAAAAA=", created: str = "t0") -> CheckpointManifest:
    return CheckpointManifest(
        version=MANIFEST_VERSION,
        step=step,
        files=[
            FileEntry(path="model.bin", size=4, checksum_algorithm="CRC64NVME", checksum=checksum)
        ],
        created=created,
    )


def _stored(store: Store, step: int) -> CheckpointManifest:
    data = store.get(RUN.key(checkpoint_prefix(step), CHECKPOINT_MANIFEST))
    assert data is not None
    return parse_checkpoint_manifest(data, step)


def test_checkpoint_manifest_is_written(store: Store) -> None:
    Committer(store, RUN, CAS, keep=3).write_checkpoint_manifest(_ckpt(4))

    assert _stored(store, 4) == _ckpt(4)


def test_identical_existing_checkpoint_manifest_is_kept(store: Store) -> None:
    committer = Committer(store, RUN, CAS, keep=3)
    committer.write_checkpoint_manifest(_ckpt(4, created="first"))
    committer.commit(_entry(4))

    committer.write_checkpoint_manifest(_ckpt(4, created="second"))

    assert _stored(store, 4).created == "first"


@pytest.mark.parametrize(
    "existing",
    [
        pytest.param(_ckpt(4, checksum="AQEBAQEBAQE=").model_dump_json().encode(), id="other"),
        pytest.param(b"{half", id="unreadable"),
    ],
)
def test_uncommitted_checkpoint_manifest_is_replaced(store: Store, existing: bytes) -> None:
    store.put(RUN.key(checkpoint_prefix(4), CHECKPOINT_MANIFEST), existing)
    committer = Committer(store, RUN, CAS, keep=3)
    committer.commit(_entry(3))  # another step is committed, 4 is not

    committer.write_checkpoint_manifest(_ckpt(4, created="ours"))

    assert _stored(store, 4) == _ckpt(4, created="ours")


def test_committed_checkpoint_manifest_with_other_contents_is_refused(store: Store) -> None:
    committer = Committer(store, RUN, CAS, keep=3)
    committer.write_checkpoint_manifest(_ckpt(4))
    committer.commit(_entry(4))

    with pytest.raises(PreconditionFailed, match="checkpoint-4 is already committed"):
        committer.write_checkpoint_manifest(_ckpt(4, checksum="AQEBAQEBAQE="))
    assert _stored(store, 4) == _ckpt(4)


# -- capability probe --------------------------------------------------------------------------


def test_detect_capabilities_against_moto(store: Store, client: Any) -> None:
    before = _keys(client)

    caps = commit.detect_capabilities(store, RUN)

    assert caps.conditional_writes
    assert caps.algorithm is CRC64NVME
    assert _keys(client) == before
    assert "conditional writes yes" in caps.describe()
