"""The S3 client signs headers, and a body only where no checksum the endpoint verifies guards it
(``trainingrun.storage.s3.sign``): data and parts go unsigned with their ``x-amz-checksum-*``, the
small
writes (manifests, fences, part lists) are signed. Requests are caught just before they would
be sent; nothing goes over the network."""

from __future__ import annotations

import base64
import hashlib
from typing import Any, cast

import pytest
from botocore.awsrequest import AWSResponse

from tests.unit.fakes import DictStore
from trainingrun.agent.sidecar import protect_bodies
from trainingrun.storage.checksum import CRC64NVME, digest
from trainingrun.storage.opener import Credentials, Store
from trainingrun.storage.s3.sign import checksummed, s3_config
from trainingrun.storage.s3.store import S3Store, make_client

UNSIGNED = "UNSIGNED-PAYLOAD"


class Raw:
    def stream(self, **_: Any) -> list[bytes]:
        return [b""]

    def read(self, *_: Any) -> bytes:
        return b""


def caught(endpoint: str) -> tuple[S3Store, list[Any]]:
    """A store whose requests are recorded and answered 200 with an ETag, unsent."""
    client = make_client(endpoint, "us-east-1", Credentials("AKIDEXAMPLE", "wJalrXUtnFEMI"))
    sent: list[Any] = []

    def answer(request: Any, **_: Any) -> AWSResponse:
        sent.append(request)
        return AWSResponse(request.url, 200, {"ETag": '"e"', "Content-Length": "0"}, Raw())

    client.meta.events.register("before-send.s3", answer)
    return S3Store(client, "b"), sent


def header(request: Any, name: str) -> str:
    value = request.headers[name]
    return value.decode() if isinstance(value, bytes) else str(value)


ENDPOINTS = ["http://127.0.0.1:8333", "https://s3.example.com"]


@pytest.mark.parametrize("endpoint", ENDPOINTS)
@pytest.mark.parametrize("conditional", [{}, {"if_none_match": True}, {"if_match": '"e1"'}])
def test_a_put_signs_its_body_and_sends_its_content_md5(
    endpoint: str, conditional: dict[str, Any]
) -> None:
    store, sent = caught(endpoint)
    body = b'{"step": 100}'
    store.put("runs/a/MANIFEST.json", body, **conditional)
    (request,) = sent
    assert header(request, "X-Amz-Content-SHA256") == hashlib.sha256(body).hexdigest()
    md5 = base64.b64encode(hashlib.md5(body, usedforsecurity=False).digest()).decode()
    assert header(request, "Content-MD5") == md5


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_the_part_list_that_completes_an_upload_is_signed(endpoint: str) -> None:
    store, sent = caught(endpoint)
    parts = [{"PartNumber": 1, "ETag": '"p1"'}]
    store.complete_multipart("runs/a/m", "u1", parts, CRC64NVME, full="AAAAAAAAAAA=")
    (request,) = sent
    assert b"<PartNumber>1</PartNumber>" in request.body
    assert header(request, "X-Amz-Content-SHA256") == hashlib.sha256(request.body).hexdigest()


@pytest.mark.parametrize(
    ("operation", "headers", "expected"),
    [
        ("PutObject", {"x-amz-checksum-crc64nvme": "x"}, True),
        ("UploadPart", {"X-Amz-Checksum-CRC32C": "x"}, True),
        ("PutObject", {"x-amz-checksum-crc32": "x"}, True),
        ("UploadPart", {"x-amz-checksum-sha256": "x"}, True),
        ("PutObject", {"x-amz-checksum-algorithm": "CRC64NVME"}, False),  # names one, no value
        ("PutObject", {"x-amz-checksum-type": "FULL_OBJECT"}, False),
        ("PutObject", {"Content-MD5": "x"}, False),
        ("PutObject", {}, False),
        # the whole object's checksum; the body is the part list
        ("CompleteMultipartUpload", {"x-amz-checksum-crc64nvme": "x"}, False),
        ("DeleteObjects", {"x-amz-checksum-crc32": "x"}, False),
    ],
)
def test_checksummed(operation: str, headers: dict[str, str], expected: bool) -> None:
    assert checksummed(operation, headers) is expected


@pytest.mark.parametrize("endpoint", ENDPOINTS)
@pytest.mark.parametrize("how", ["put_checked", "upload_part"])
def test_checked_data_goes_unsigned_with_its_checksum(endpoint: str, how: str) -> None:
    store, sent = caught(endpoint)
    data = b"w" * 4096
    checksum = digest(CRC64NVME, data)
    if how == "put_checked":
        store.put_checked("runs/a/model.safetensors", data, CRC64NVME, checksum)
    else:
        store.upload_part("runs/a/model.safetensors", "u1", 3, data, CRC64NVME, checksum)
    (request,) = sent
    assert header(request, "X-Amz-Content-SHA256") == UNSIGNED
    assert header(request, "x-amz-checksum-crc64nvme") == checksum
    assert "Signature=" in header(request, "Authorization")


@pytest.mark.parametrize(
    ("endpoint", "expected"),
    [
        (None, {"payload_signing_enabled": False}),
        ("http://127.0.0.1:8333", {"payload_signing_enabled": False, "addressing_style": "path"}),
    ],
)
def test_s3_config(endpoint: str | None, expected: dict[str, Any]) -> None:
    assert s3_config(endpoint) == expected


@pytest.mark.parametrize("endpoint", ENDPOINTS)
@pytest.mark.parametrize("how", ["put", "put_checked", "upload_part"])
def test_after_sign_bodies_each_signature_covers_the_bodys_sha256(endpoint: str, how: str) -> None:
    store, sent = caught(endpoint)
    store.sign_bodies()
    data = b"w" * 4096
    if how == "put":
        store.put("runs/a/MANIFEST.json", data)
    elif how == "put_checked":
        store.put_checked("runs/a/model.safetensors", data, CRC64NVME, digest(CRC64NVME, data))
    else:
        store.upload_part("runs/a/m", "u1", 3, data, CRC64NVME, digest(CRC64NVME, data))
    (request,) = sent
    assert header(request, "X-Amz-Content-SHA256") == hashlib.sha256(data).hexdigest()
    assert request.url.startswith(f"{endpoint}/b/runs/a/")  # still path-style


@pytest.mark.parametrize(("verifies", "signed"), [(True, False), (False, True)])
def test_bodies_are_signed_only_where_the_endpoint_ignores_checksums(
    verifies: bool, signed: bool
) -> None:
    store = DictStore()
    protect_bodies(cast(Store, store), checked=verifies)
    assert store.signs_bodies is signed


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_reads_stay_unsigned(endpoint: str) -> None:
    """A read has no body: nothing to sign, and the restore's requests stay as they were."""
    store, sent = caught(endpoint)
    store.head("runs/a/model.safetensors")
    store.read_range("runs/a/model.safetensors", 0, 0, lambda _block: None)
    assert [header(r, "X-Amz-Content-SHA256") for r in sent] == [UNSIGNED, UNSIGNED]


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_the_list_of_keys_to_delete_is_signed(endpoint: str) -> None:
    store, sent = caught(endpoint)
    store.delete(["runs/a/x", "runs/a/y"])
    (request,) = sent
    assert header(request, "X-Amz-Content-SHA256") == hashlib.sha256(request.body).hexdigest()
