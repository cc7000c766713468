"""The S3 client signs headers, not bodies: every body it sends carries a checksum the endpoint
verifies instead (the data's ``x-amz-checksum-*``, Content-MD5 on ``put``). Requests are caught
just before they would be sent; nothing goes over the network."""

from __future__ import annotations

import base64
import hashlib
from typing import Any, cast

import pytest
from botocore.awsrequest import AWSResponse

from tests.unit.fakes import DictStore
from trainingrun.checksum import CRC64NVME, digest
from trainingrun.s3store import S3Store, make_client, s3_config
from trainingrun.storage import Credentials, Store
from trainingrun.syncsupport import protect_bodies

UNSIGNED = "UNSIGNED-PAYLOAD"


class Raw:
    def stream(self, **_: Any) -> list[bytes]:
        return [b""]


def caught(endpoint: str) -> tuple[S3Store, list[Any]]:
    """A store whose requests are recorded and answered 200 with an ETag, unsent."""
    client = make_client(endpoint, "us-east-1", Credentials("AKIDEXAMPLE", "wJalrXUtnFEMI"))
    sent: list[Any] = []

    def answer(request: Any, **_: Any) -> AWSResponse:
        sent.append(request)
        return AWSResponse(request.url, 200, {"ETag": '"e"'}, Raw())

    client.meta.events.register("before-send.s3", answer)
    return S3Store(client, "b"), sent


def header(request: Any, name: str) -> str:
    value = request.headers[name]
    return value.decode() if isinstance(value, bytes) else str(value)


ENDPOINTS = ["http://127.0.0.1:8333", "https://s3.example.com"]


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_a_put_sends_an_unsigned_body_with_its_content_md5(endpoint: str) -> None:
    store, sent = caught(endpoint)
    body = b'{"step": 100}'
    store.put("runs/a/MANIFEST.json", body)
    (request,) = sent
    assert header(request, "X-Amz-Content-SHA256") == UNSIGNED
    md5 = base64.b64encode(hashlib.md5(body, usedforsecurity=False).digest()).decode()
    assert header(request, "Content-MD5") == md5


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
