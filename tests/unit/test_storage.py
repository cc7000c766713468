"""Storage: the choice of a checkpoint to resume from, and what S3 errors mean.

Covers:

- choose_checkpoint() (trainingrun.checkpoint.lookup) against an in-memory store: the newest
committed
  step with every object at its recorded size is chosen, as a Committed of its parts; a
  missing object, a wrong size, a missing MANIFEST.json, a malformed or deeply nested
  MANIFEST.json or one naming another step each make it fall back to the previous step, with a
  reason that names the file; bad steps are skipped (and are not reasons); no manifest or
  nothing intact gives no choice; a manifest passed in is used without reading the bucket;
  hypothesis over which checkpoints are broken or bad: the choice is always the newest intact
  step not marked bad, and every newer non-bad step is reported as rejected;
- version 2 (epochs and ranks): the parts of every rank are merged (a file all ranks wrote
  alike, once), a version-1 step beside them still counts, and only the entry's own epoch is
  read; a missing part, a part of another epoch, a missing object of one rank or two ranks
  with different bytes for one file each make it fall back, naming the part's key;
- what a store call raises for what the client raised (a read of a client that raises it):
  404/NoSuchKey (KeyNotFound) and NoSuchBucket (BucketNotFound), 412, 403 and credential codes,
  checksum codes, other 4xx, 408/429/5xx, missing credentials, connection errors, and an
  unrelated exception that is re-raised as is;
- Store.delete(): chunks of 1000 keys; keys DeleteObjects reports as not deleted (a 200
  answer) raise a StorageError naming the first and the count;
- open_store(): the store of the storage URI's bucket, its client on the spec's endpoint and
  region;
- parse_uri() and Location.key().
"""

from __future__ import annotations

import http.client
import json
from typing import Any, cast

import botocore.exceptions
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.fakes import FakeBucket
from trainingrun.api import StorageSpec
from trainingrun.checkpoint.lookup import choose_checkpoint
from trainingrun.checkpoint.manifest import (
    CHECKPOINT_MANIFEST,
    MANIFEST_VERSION,
    RUN_MANIFEST,
    CheckpointManifest,
    FileEntry,
    ManifestEntry,
    RunManifest,
    checkpoint_prefix,
    epoch_prefix,
    parse_run_manifest,
    part_prefix,
)
from trainingrun.storage.checksum import CRC64NVME, digest
from trainingrun.storage.opener import (
    BucketNotFound,
    ChecksumMismatch,
    KeyNotFound,
    Location,
    PreconditionFailed,
    S3Store,
    StorageAccessDenied,
    StorageError,
    StorageRejected,
    StorageUnavailable,
    Store,
    open_store,
    parse_uri,
)

RUN = Location("bucket", "runs/ml/r1")
FILES = {"model.safetensors": b"weights" * 10, "optimizer.pt": b"adam", "trainer_state.json": b"{}"}


class Bucket:
    """A run's bucket contents, built checkpoint by checkpoint, then broken on purpose."""

    def __init__(self) -> None:
        self.fake = FakeBucket()

    @property
    def store(self) -> Store:
        return cast(Store, self.fake)

    def key(self, step: int, name: str) -> str:
        return RUN.key(checkpoint_prefix(step), name)

    def commit(self, *steps: int) -> Bucket:
        self.fake.commit(RUN, *steps, files=FILES)
        return self

    def break_(self, step: int, how: str) -> Bucket:
        objects = self.fake.objects
        if how == "missing-object":
            del objects[self.key(step, "optimizer.pt")]
        elif how == "wrong-size":
            objects[self.key(step, "model.safetensors")] += b"!"
        elif how == "no-manifest":
            del objects[self.key(step, CHECKPOINT_MANIFEST)]
        elif how == "malformed-manifest":
            objects[self.key(step, CHECKPOINT_MANIFEST)] = b'{"version": 1, "files": ['
        elif how == "nested-manifest":
            objects[self.key(step, CHECKPOINT_MANIFEST)] = b"[" * 20_000
        elif how == "manifest-of-other-step":
            objects[self.key(step, CHECKPOINT_MANIFEST)] = objects[
                self.key(step, CHECKPOINT_MANIFEST)
            ].replace(f'"step": {step}'.encode(), f'"step": {step + 1}'.encode())
        else:
            raise AssertionError(how)
        return self


FAULTS = {
    "missing-object": "optimizer.pt is missing",
    "wrong-size": "model.safetensors has 71 bytes, manifest says 70",
    "no-manifest": "checkpoints/checkpoint-{step}/MANIFEST.json is missing",
    "malformed-manifest": "checkpoint-{step}/MANIFEST.json is not valid JSON",
    "nested-manifest": "checkpoint-{step}/MANIFEST.json is not valid JSON",
    "manifest-of-other-step": "checkpoint-{step}/MANIFEST.json says step {next}",
}


def test_newest_intact_committed_step_is_chosen() -> None:
    bucket = Bucket().commit(100, 300, 200)

    choice = choose_checkpoint(bucket.store, RUN, set())

    assert choice.entry is not None
    assert choice.entry.step == 300
    assert choice.checkpoint is not None
    assert choice.checkpoint.entry == choice.entry
    assert sorted(choice.checkpoint.files) == sorted(
        (f"{checkpoint_prefix(300)}{f.path}", f) for f in choice.checkpoint.parts[0][1].files
    )
    assert sorted(f.path for _, f in choice.checkpoint.files) == sorted(FILES)
    assert choice.checkpoint.total_bytes == sum(len(d) for d in FILES.values())
    assert choice.rejected == []


@pytest.mark.parametrize(("how", "reason"), list(FAULTS.items()), ids=list(FAULTS))
def test_broken_newest_falls_back_to_the_previous(how: str, reason: str) -> None:
    bucket = Bucket().commit(100, 200).break_(200, how)

    choice = choose_checkpoint(bucket.store, RUN, set())

    assert choice.entry is not None
    assert choice.entry.step == 100
    assert len(choice.rejected) == 1
    step, why = choice.rejected[0]
    assert step == 200
    assert reason.format(step=200, next=201) in why


def test_bad_steps_are_skipped_without_a_reason() -> None:
    bucket = Bucket().commit(100, 200, 300)

    choice = choose_checkpoint(bucket.store, RUN, {300, 200})

    assert choice.entry is not None
    assert choice.entry.step == 100
    assert choice.rejected == []
    assert all("checkpoint-300" not in k and "checkpoint-200" not in k for k in bucket.fake.gets)


@pytest.mark.parametrize(
    ("bucket", "bad", "rejected"),
    [
        pytest.param(Bucket(), set(), [], id="nothing-committed"),
        pytest.param(Bucket().commit(1), {1}, [], id="only-step-bad"),
        pytest.param(
            Bucket().commit(1, 2).break_(1, "no-manifest").break_(2, "wrong-size"),
            set(),
            [2, 1],
            id="every-step-broken",
        ),
    ],
)
def test_no_choice(bucket: Bucket, bad: set[int], rejected: list[int]) -> None:
    choice = choose_checkpoint(bucket.store, RUN, bad)

    assert (choice.entry, choice.checkpoint) == (None, None)
    assert [s for s, _ in choice.rejected] == rejected


def test_a_manifest_passed_in_is_not_read_again() -> None:
    bucket = Bucket().commit(100, 200)
    only_100 = RunManifest(
        entries=[
            ManifestEntry(step=100, prefix=checkpoint_prefix(100), committed="t", files=3, bytes=1)
        ]
    )

    choice = choose_checkpoint(bucket.store, RUN, set(), manifest=only_100)
    none = choose_checkpoint(bucket.store, RUN, set(), manifest=None)

    assert choice.entry is not None
    assert choice.entry.step == 100
    assert RUN.key(RUN_MANIFEST) not in bucket.fake.gets
    assert none.entry is None


@settings(max_examples=100, deadline=None)
@given(
    st.dictionaries(
        st.integers(min_value=0, max_value=10_000),
        st.tuples(st.sampled_from([None, None, *FAULTS]), st.booleans()),
        max_size=8,
    )
)
def test_choice_is_the_newest_intact_step_not_marked_bad(
    plan: dict[int, tuple[str | None, bool]],
) -> None:
    bucket = Bucket().commit(*plan)
    for step, (fault, _) in plan.items():
        if fault:
            bucket.break_(step, fault)
    bad = {s for s, (_, is_bad) in plan.items() if is_bad}

    choice = choose_checkpoint(bucket.store, RUN, bad)

    intact = [s for s, (fault, is_bad) in plan.items() if fault is None and not is_bad]
    expected = max(intact, default=None)
    assert (choice.entry.step if choice.entry else None) == expected
    assert (choice.checkpoint.entry if choice.checkpoint else None) == choice.entry
    newer = sorted(
        (s for s in plan if s not in bad and (expected is None or s > expected)), reverse=True
    )
    assert [s for s, _ in choice.rejected] == newer
    assert all(why for _, why in choice.rejected)


# -- version 2: epochs and ranks -----------------------------------------------------------


def _crc(data: bytes) -> str:
    return digest(CRC64NVME, data)


def _v2(bucket: Bucket, step: int, epoch: int, ranks: int = 2, shared: bytes = b"{}") -> Bucket:
    """Commits ``step`` as ``ranks`` parts of ``epoch``: a file of each rank's own and
    ``trainer_state.json``, which every rank writes (``shared`` for the last rank)."""
    for rank in range(ranks):
        files = {f"model-{rank}.bin": b"w" * (10 + rank)}
        files["trainer_state.json"] = shared if rank == ranks - 1 else b"{}"
        for name, data in files.items():
            bucket.fake.put(RUN.key(part_prefix(step, epoch, rank), name), data)
        entries = [
            FileEntry(path=n, size=len(d), checksum_algorithm="CRC64NVME", checksum=_crc(d))
            for n, d in files.items()
        ]
        who = {"epoch": epoch, "rank": rank, "ranks": ranks}
        part = CheckpointManifest(
            version=MANIFEST_VERSION, step=step, files=entries, created="t", **who
        )
        key = RUN.key(part_prefix(step, epoch, rank), CHECKPOINT_MANIFEST)
        bucket.fake.put(key, part.model_dump_json().encode())
    before = parse_run_manifest(bucket.fake.objects[RUN.key(RUN_MANIFEST)])
    entry = {"step": step, "prefix": epoch_prefix(step, epoch), "committed": "t", "files": 1}
    entry |= {"bytes": 1, "epoch": epoch, "ranks": ranks}
    entries_after = [*before.entries, ManifestEntry.model_validate(entry)]
    after = before.model_copy(update={"entries": entries_after, "fence": epoch})
    bucket.fake.put(RUN.key(RUN_MANIFEST), after.to_json())
    return bucket


def test_parts_of_every_rank_are_merged() -> None:
    bucket = _v2(Bucket().commit(100), 200, epoch=3, ranks=3)
    bucket.fake.put(RUN.key(part_prefix(200, 2, 0), "model-0.bin"), b"an older epoch's")

    choice = choose_checkpoint(bucket.store, RUN, set())

    assert choice.entry is not None
    assert choice.checkpoint is not None
    assert (choice.entry.step, choice.rejected) == (200, [])
    assert [key for key, _ in choice.checkpoint.files] == [
        "checkpoints/checkpoint-200/e3/r0/model-0.bin",
        "checkpoints/checkpoint-200/e3/r0/trainer_state.json",
        "checkpoints/checkpoint-200/e3/r1/model-1.bin",
        "checkpoints/checkpoint-200/e3/r2/model-2.bin",
    ]
    assert choice.checkpoint.total_bytes == 10 + 2 + 11 + 12
    parts = [RUN.key(part_prefix(200, 3, r), CHECKPOINT_MANIFEST) for r in range(3)]
    assert bucket.fake.gets == [RUN.key(RUN_MANIFEST), *parts]  # not epoch 2's, nor step 100


V2_FAULTS = {
    "part-missing": "checkpoints/checkpoint-200/e3/r1/MANIFEST.json is missing",
    "part-of-another-epoch": "checkpoints/checkpoint-200/e3/r1/MANIFEST.json says step 200, "
    "epoch 2, rank 1; expected 200, 3, 1",
    "object-missing": "model-1.bin is missing",
    "ranks-disagree": "checkpoint-200: ranks 0 and 1 both wrote trainer_state.json with "
    "different contents",
}


@pytest.mark.parametrize(("how", "reason"), list(V2_FAULTS.items()), ids=list(V2_FAULTS))
def test_a_broken_part_falls_back(how: str, reason: str) -> None:
    bucket = _v2(
        Bucket().commit(100), 200, epoch=3, shared=b'{"a": 1}' if "disagree" in how else b"{}"
    )
    part = RUN.key(part_prefix(200, 3, 1), CHECKPOINT_MANIFEST)
    if how == "part-missing":
        del bucket.fake.objects[part]
    elif how == "part-of-another-epoch":
        bucket.fake.objects[part] = bucket.fake.objects[part].replace(b'"epoch":3', b'"epoch":2')
    elif how == "object-missing":
        del bucket.fake.objects[RUN.key(part_prefix(200, 3, 1), "model-1.bin")]

    choice = choose_checkpoint(bucket.store, RUN, set())

    assert choice.entry is not None
    assert choice.entry.step == 100
    assert [s for s, _ in choice.rejected] == [200]
    assert reason in choice.rejected[0][1]


# -- error translation ------------------------------------------------------------------


class RaisingClient:
    """A boto3 client whose every read raises ``err``."""

    def __init__(self, err: Exception) -> None:
        self.err = err

    def get_object(self, **_: Any) -> Any:
        raise self.err


def _raised_by_a_read(err: Exception) -> StorageError:
    """What the store raises when its client raised ``err``."""
    store = S3Store(client=RaisingClient(err), bucket="b")
    with pytest.raises(StorageError) as raised:
        store.read_range("k", 0, 9, lambda block: None)
    return raised.value


def _client_error(status: int, code: str) -> botocore.exceptions.ClientError:
    response: Any = {"Error": {"Code": code, "Message": "x"}, "ResponseMetadata": {}}
    if status:
        response["ResponseMetadata"]["HTTPStatusCode"] = status
    return botocore.exceptions.ClientError(response, "PutObject")


@pytest.mark.parametrize(
    ("err", "kind", "words"),
    [
        pytest.param(_client_error(404, "NoSuchKey"), KeyNotFound, "does not exist", id="404"),
        pytest.param(_client_error(404, "404"), KeyNotFound, "does not exist", id="bare-404"),
        pytest.param(_client_error(0, "NoSuchKey"), KeyNotFound, "s3://b/k", id="no-such-key"),
        pytest.param(
            _client_error(404, "NoSuchBucket"), BucketNotFound, "create it first", id="no-bucket"
        ),
        pytest.param(
            _client_error(412, "PreconditionFailed"), PreconditionFailed, "condition", id="412"
        ),
        pytest.param(
            _client_error(403, "AccessDenied"), StorageAccessDenied, "credentials", id="403"
        ),
        pytest.param(
            _client_error(400, "InvalidAccessKeyId"),
            StorageAccessDenied,
            "InvalidAccessKeyId",
            id="bad-key-id",
        ),
        pytest.param(
            _client_error(403, "SignatureDoesNotMatch"),
            StorageAccessDenied,
            "s3:PutObject",
            id="bad-signature",
        ),
        pytest.param(
            _client_error(400, "BadDigest"), ChecksumMismatch, "mismatch", id="bad-digest"
        ),
        pytest.param(
            _client_error(400, "XAmzContentChecksumMismatch"),
            ChecksumMismatch,
            "XAmzContentChecksumMismatch",
            id="checksum-mismatch",
        ),
        pytest.param(
            _client_error(400, "InvalidRequest"), StorageRejected, "refused", id="other-400"
        ),
        pytest.param(
            _client_error(501, "NotImplemented"), StorageUnavailable, "NotImplemented", id="501"
        ),
        pytest.param(_client_error(503, "SlowDown"), StorageUnavailable, "SlowDown", id="503"),
        pytest.param(
            _client_error(429, "TooManyRequests"), StorageUnavailable, "TooMany", id="429"
        ),
        pytest.param(
            _client_error(408, "RequestTimeout"), StorageUnavailable, "RequestTimeout", id="408"
        ),
        pytest.param(
            botocore.exceptions.NoCredentialsError(),
            StorageAccessDenied,
            "credentialsSecret",
            id="no-credentials",
        ),
        pytest.param(
            botocore.exceptions.EndpointConnectionError(endpoint_url="http://127.0.0.1:1"),
            StorageUnavailable,
            "127.0.0.1:1",
            id="connection-refused",
        ),
        pytest.param(ConnectionResetError("reset"), StorageUnavailable, "reset", id="os-error"),
        pytest.param(
            http.client.IncompleteRead(b"x", 99),
            StorageUnavailable,
            "99 more expected",
            id="body-cut-short",
        ),
    ],
)
def test_errors_are_translated(err: Exception, kind: type[StorageError], words: str) -> None:
    translated = _raised_by_a_read(err)

    assert type(translated) is kind
    assert words in str(translated)


class DeleteObjectsClient:
    """delete_objects answering as S3 does: 200, with the keys it could not delete listed."""

    def __init__(self, denied: set[str]) -> None:
        self.denied = denied
        self.calls: list[list[str]] = []

    def delete_objects(self, Bucket: str, Delete: dict[str, Any]) -> dict[str, Any]:
        keys = [o["Key"] for o in Delete["Objects"]]
        self.calls.append(keys)
        errors = [
            {"Key": k, "Code": "AccessDenied", "Message": "Access Denied"}
            for k in keys
            if k in self.denied
        ]
        return {"Deleted": [{"Key": k} for k in keys if k not in self.denied], "Errors": errors}


@pytest.mark.parametrize(
    ("count", "denied", "error"),
    [
        pytest.param(3, set(), None, id="all-deleted"),
        pytest.param(2500, set(), None, id="chunks-of-1000"),
        pytest.param(3, {"k1"}, "1 of 3 objects not deleted (AccessDenied", id="one-refused"),
    ],
)
def test_delete_reports_the_keys_it_could_not_delete(
    count: int, denied: set[str], error: str | None
) -> None:
    client = DeleteObjectsClient(denied)
    store = S3Store(client=client, bucket="b")
    keys = [f"k{i}" for i in range(count)]

    if error is None:
        store.delete(keys)
        assert [len(c) for c in client.calls] == [
            min(1000, count - i) for i in range(0, count, 1000)
        ]
    else:
        with pytest.raises(StorageError, match=r"s3://b/k1: ") as e:
            store.delete(keys)
        assert error in str(e.value)


def test_an_unrelated_exception_is_not_swallowed() -> None:
    with pytest.raises(KeyError):
        _raised_by_a_read(KeyError("bug"))


def test_open_store_uses_the_specs_bucket_endpoint_and_region() -> None:
    spec = StorageSpec.model_validate(
        {"uri": "s3://ckpt/runs/", "endpoint": "http://s3.local:8333", "region": "eu-west-3"}
    )

    store = open_store(spec, {"AWS_ACCESS_KEY_ID": "AKIA", "AWS_SECRET_ACCESS_KEY": "s3cr3t"})

    assert store.bucket == "ckpt"
    assert store.client.meta.endpoint_url == "http://s3.local:8333"
    assert store.client.meta.region_name == "eu-west-3"


@pytest.mark.parametrize(
    ("uri", "bucket", "prefix"),
    [
        pytest.param("s3://b", "b", "", id="bucket-only"),
        pytest.param("s3://b/", "b", "", id="bucket-slash"),
        pytest.param("s3://b/runs/x/", "b", "runs/x", id="prefix-slashes-stripped"),
    ],
)
def test_parse_uri(uri: str, bucket: str, prefix: str) -> None:
    assert parse_uri(uri) == Location(bucket, prefix)


@pytest.mark.parametrize(
    "uri",
    ["b/runs", "hdfs://b/x", "s3://", "s3:///x", "az://acct", "az:///c"],
    ids=["no-scheme", "hdfs", "empty", "no-bucket", "az-no-container", "az-no-account"],
)
def test_parse_uri_refuses(uri: str) -> None:
    with pytest.raises(ValueError, match="storage uri"):
        parse_uri(uri)


def test_location_key_joins_without_double_slashes() -> None:
    assert RUN.key(checkpoint_prefix(7), CHECKPOINT_MANIFEST) == (
        "runs/ml/r1/checkpoints/checkpoint-7/MANIFEST.json"
    )
    assert Location("b", "").key(RUN_MANIFEST) == "manifest.json"
    assert json.loads(RunManifest().to_json())["version"] == MANIFEST_VERSION
