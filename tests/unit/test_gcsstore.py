"""The GCS store's own decisions, without a server (trainingrun.storage.gcs.store).

Covers:

- translate(): google.api_core errors by status (404 of an object, of the bucket by its message,
  a bare 404 settled by asking whether the bucket is there; 412; 401/403 naming GCS's own
  permissions, role and docs; 400 with a CRC32C or MD5 complaint; other 4xx; 408/429/5xx),
  google.auth errors (no default credentials, a refused refresh, a retryable one), a budget
  that ran out (RetryError), connection errors and timeouts of requests, a download's
  DataCorruption; an unrelated exception is re-raised as is; no message carries a request's URL
  (a resumable upload's session URL is a credential);
- part and intermediate object names: parse_piece() gives back (key, upload id) for keys with
  slashes, dots and the marker itself, and None for every other name;
- compose_plan(): at most 32 sources a step, the key made last, every intermediate made before
  it is used and used once, and the leaves joined in their order (1 to 10 000 parts);
- Blocks: the library's small writes reach the sink in blocks of exactly ``chunk`` (the last
  one shorter), and the count is every byte;
- refusals without a call: an algorithm other than CRC32C (StorageRejected, so the capability
  probe moves on), a credentialsSecret value that is not a service-account key
  (StorageMisconfigured, naming the key but never its value).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import requests
from google.api_core import exceptions as gexc
from google.auth import exceptions as auth_exc
from google.cloud.storage import exceptions as storage_exc

from trainingrun.storage import checksum
from trainingrun.storage.base import (
    OPERATOR_BUDGET,
    BucketNotFound,
    ChecksumMismatch,
    KeyNotFound,
    Location,
    PreconditionFailed,
    StorageAccessDenied,
    StorageMisconfigured,
    StorageRejected,
    StorageUnavailable,
)
from trainingrun.storage.gcs.store import (
    MAX_COMPOSE,
    Blocks,
    GcsStore,
    compose_plan,
    open_gcs,
    parse_piece,
    part_name,
    translate,
    upload_prefix,
)

WHERE = "gs://bkt/runs/a/model.safetensors"
SESSION = "upload_id=SESSIONTOKEN123"
URL = f"PUT https://storage.googleapis.com/upload/storage/v1/b/bkt/o?{SESSION}"
CRC_BODY = '{"error": {"code": 400, "message": "Provided CRC32C \\"AAAAAA==\\" doesn\'t match calculated CRC32C \\"BBBBBB==\\"."}}'  # noqa: E501


def _never() -> bool:
    raise AssertionError("the bucket was asked about though the message said")


@pytest.mark.parametrize(
    ("err", "missing", "expected", "words"),
    [
        (gexc.NotFound("No such object: bkt/runs/a/model.safetensors"), _never, KeyNotFound, []),
        (
            gexc.NotFound("The specified bucket does not exist."),
            _never,
            BucketNotFound,
            ["gs://bkt"],
        ),
        (gexc.NotFound("Not Found"), lambda: True, BucketNotFound, ["create it first"]),
        (gexc.NotFound("Not Found"), lambda: False, KeyNotFound, [WHERE]),
        (gexc.PreconditionFailed("conditionNotMet"), _never, PreconditionFailed, [WHERE]),
        (
            gexc.Forbidden("sa@p.iam.gserviceaccount.com does not have storage.objects.create"),
            _never,
            StorageAccessDenied,
            ["storage.objects.get", "storage.objects.create", "storage.objects.delete"],
        ),
        (
            gexc.Unauthorized("Anonymous caller"),
            _never,
            StorageAccessDenied,
            [
                "storage.objects.list",
                "roles/storage.objectUser",
                "docs/storage-gcs.md#permissions-on-cloud-storage",
            ],
        ),
        (gexc.BadRequest(f"{URL}: {CRC_BODY}"), _never, ChecksumMismatch, ["checksum mismatch"]),
        (  # as the library words a failed upload: the body, then the response's repr
            gexc.BadRequest(f"{URL} {CRC_BODY}\n: ('Request failed with status code', 400)"),
            _never,
            ChecksumMismatch,
            ["found a checksum mismatch (400)"],
        ),
        (gexc.BadRequest("provided MD5 hash doesn't match"), _never, ChecksumMismatch, []),
        (gexc.BadRequest("Invalid argument."), _never, StorageRejected, ["400", WHERE]),
        (gexc.RequestRangeNotSatisfiable(URL), _never, StorageRejected, ["416"]),
        (gexc.from_http_status(408, "timeout"), _never, StorageUnavailable, ["408"]),
        (gexc.TooManyRequests("rateLimitExceeded"), _never, StorageUnavailable, ["429"]),
        (gexc.InternalServerError(URL), _never, StorageUnavailable, ["500"]),
        (gexc.ServiceUnavailable("backendError"), _never, StorageUnavailable, ["503"]),
        (
            gexc.RetryError("Timeout of 34.0s exceeded", cause=gexc.ServiceUnavailable("x")),
            _never,
            StorageUnavailable,
            ["gave up retrying", "ServiceUnavailable"],
        ),
        (
            auth_exc.DefaultCredentialsError("Your default credentials were not found."),
            _never,
            StorageAccessDenied,
            ["no Google credentials", "GOOGLE_SERVICE_ACCOUNT_JSON", "Workload Identity"],
        ),
        (auth_exc.RefreshError("invalid_grant"), _never, StorageAccessDenied, ["refused"]),
        (
            auth_exc.RefreshError("metadata server busy", retryable=True),
            _never,
            StorageUnavailable,
            [],
        ),
        (auth_exc.TransportError("dns"), _never, StorageUnavailable, []),
        (
            requests.ConnectionError(f"Max retries exceeded with url: /o?{SESSION}"),
            _never,
            StorageUnavailable,
            ["ConnectionError"],
        ),
        (requests.Timeout("read timed out"), _never, StorageUnavailable, ["Timeout"]),
        (storage_exc.DataCorruption(None, "crc32c mismatch"), _never, StorageUnavailable, []),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, Exception) else None,
)
def test_translate(
    err: Exception, missing: Callable[[], bool], expected: type, words: list[str]
) -> None:
    got = translate(err, WHERE, "bkt", missing)
    assert type(got) is expected
    for word in words:
        assert word in str(got)
    assert "SESSIONTOKEN123" not in str(got)
    assert "http" not in str(got)


@pytest.mark.parametrize(
    "err",
    [
        gexc.BadRequest(f"{URL}: {CRC_BODY}"),
        gexc.BadRequest(f"{URL} {CRC_BODY}\n: ('Request failed with status code', 400)"),
    ],
    ids=["message", "failed-upload"],
)
def test_the_endpoints_words_of_a_mismatch_go_to_the_log_only(err: Exception) -> None:
    got = translate(err, WHERE, "bkt", _never)
    assert "AAAAAA==" not in str(got)
    assert "AAAAAA==" in got.detail
    assert "\n" not in got.detail


def test_translate_re_raises_what_is_not_a_storage_error() -> None:
    with pytest.raises(ValueError, match="a bug"):
        translate(ValueError("a bug"), WHERE, "bkt", _never)


# An upload id as the store makes them (uuid4 hex), fixed: the tests' ids must be the same in
# every pytest-xdist worker.
UPLOAD = "87a975a8b60d48bd9d1016a2c1b5fa54"


@pytest.mark.parametrize(
    "key",
    [
        "m",
        "runs/a/checkpoints/checkpoint-10/e1/r0/model.safetensors",
        "a.b/c.d",
        "x" * 300,
        f"odd/name.trainingrun-upload-{UPLOAD}-p00001",
    ],
)
def test_piece_names_give_back_key_and_upload(key: str) -> None:
    for number in (1, 2, 99, 10000):
        name = part_name(key, UPLOAD, number)
        assert name.startswith(upload_prefix(key, UPLOAD))
        assert parse_piece(name) == (key, UPLOAD)
    assert parse_piece(f"{upload_prefix(key, UPLOAD)}c2-00017") == (key, UPLOAD)  # intermediate
    assert parse_piece(key) is None or key.startswith("odd/")


@pytest.mark.parametrize(
    "name",
    [
        "model.safetensors",
        "a.trainingrun-upload-",
        f"a.trainingrun-upload-{UPLOAD}",
        f"a.trainingrun-upload-{UPLOAD}-p1",
        f"a.trainingrun-upload-{UPLOAD[:-1]}-p00001",
        f"a.trainingrun-upload-{UPLOAD}-p00001x",
        f"a.trainingrun-upload-{UPLOAD.upper()}-p00001",
    ],
)
def test_other_names_are_no_pieces(name: str) -> None:
    assert parse_piece(name) is None


@pytest.mark.parametrize("count", [1, 3, 32, 33, 40, 64, 1024, 1025, 1057, 10000])
def test_compose_plan_joins_in_order_within_the_limit(count: int) -> None:
    leaves = [f"p{i:05d}" for i in range(count)]
    steps = compose_plan("key", leaves, lambda level, i: f"c{level}-{i}")
    made: dict[str, list[str]] = {leaf: [leaf] for leaf in leaves}
    used: set[str] = set()
    for dest, sources in steps:
        assert 1 <= len(sources) <= MAX_COMPOSE
        assert dest not in made  # each destination made once
        assert not used & set(sources)  # each source used once
        used |= set(sources)
        made[dest] = [leaf for s in sources for leaf in made[s]]  # KeyError: used before made
    assert steps[-1][0] == "key"
    assert made["key"] == leaves
    assert used == set(made) - {"key"}  # every intermediate is used
    expected_steps = {1: 1, 3: 1, 32: 1, 33: 2, 40: 2, 64: 3, 1024: 33, 1025: 34, 1057: 35}
    assert len(steps) == expected_steps.get(count, len(steps))


@pytest.mark.parametrize(("writes", "chunk"), [([8192] * 10, 20000), ([5, 7, 100000, 3], 4096)])
def test_blocks_reach_the_sink_in_chunks(writes: list[int], chunk: int) -> None:
    got: list[bytes] = []
    out = Blocks(got.append, chunk)
    data = bytes(i % 251 for i in range(sum(writes)))
    at = 0
    for n in writes:
        assert out.write(data[at : at + n]) == n
        at += n
    out.flush()
    assert b"".join(got) == data and out.count == len(data)
    assert all(len(b) == chunk for b in got[:-1]) and 0 < len(got[-1]) <= chunk


def _no_client() -> Any:
    raise AssertionError("a call was made")


@pytest.mark.parametrize("algo", [checksum.CRC64NVME, checksum.CRC32, checksum.SHA256])
def test_algorithms_other_than_crc32c_are_refused_without_a_call(
    algo: checksum.Algorithm,
) -> None:
    store = GcsStore(_no_client, "bkt", OPERATOR_BUDGET)
    with pytest.raises(StorageRejected, match="CRC32C"):
        store.put_checked("k", b"x", algo, checksum.digest(algo, b"x"))
    with pytest.raises(StorageRejected, match="CRC32C"):
        store.create_multipart("k", algo)
    with pytest.raises(StorageRejected, match="CRC32C"):
        store.upload_part("k", UPLOAD, 1, b"x", algo, checksum.digest(algo, b"x"))
    assert store.url("a/b") == "gs://bkt/a/b" and store.scheme == "gs"
    assert len(store.create_multipart("k", checksum.CRC32C)) == 32


@pytest.mark.parametrize(
    "value",
    [
        "not json SECRETVALUE",
        '{"type": "service_account", "private_key": "SECRETVALUE"}',
        '{"type": "service_account", "private_key": "SECRETVALUE", "client_email": "a@b", '
        '"token_uri": "https://oauth2.googleapis.com/token"}',
        '["SECRETVALUE"]',
    ],
)
def test_a_secret_that_is_no_service_account_key_is_misconfigured(value: str) -> None:
    with pytest.raises(StorageMisconfigured) as e:
        open_gcs(
            Location("bkt", "", "gs"), None, {"GOOGLE_SERVICE_ACCOUNT_JSON": value}, OPERATOR_BUDGET
        )
    assert "GOOGLE_SERVICE_ACCOUNT_JSON" in str(e.value)
    assert "SECRETVALUE" not in str(e.value)
