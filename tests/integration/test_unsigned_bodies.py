"""Against the real SeaweedFS: the S3 client leaves data bodies out of the signature, so the
checksum each one carries is what the endpoint checks, and signs the small writes' bodies. A
body that does not match its Content-MD5, its x-amz-checksum or its signature is refused, and
nothing is stored under its key."""

from __future__ import annotations

import base64
import hashlib
import uuid
from typing import Any, cast

import botocore.exceptions
import pytest

from tests import localenv as localenv_mod
from tests.integration.stores import Bucket
from trainingrun.storage.base import StorageError
from trainingrun.storage.checksum import CRC64NVME, digest
from trainingrun.storage.s3.store import S3Store


@pytest.fixture
def seaweedfs_store(localenv: localenv_mod.LocalEnv) -> S3Store:
    """The store of the environment's SeaweedFS bucket."""
    return cast(S3Store, Bucket.seaweedfs(localenv).store())


def key() -> str:
    return f"unsigned/{uuid.uuid4().hex}/data"


def test_bodies_sent_unsigned_with_their_checksums_are_stored(seaweedfs_store: S3Store) -> None:
    manifest, data = key(), key()
    seaweedfs_store.put(manifest, b'{"step": 10}')
    seaweedfs_store.put_checked(data, b"w" * 5000, CRC64NVME, digest(CRC64NVME, b"w" * 5000))
    assert seaweedfs_store.get(manifest) == b'{"step": 10}'
    assert seaweedfs_store.get(data) == b"w" * 5000


def test_a_body_that_does_not_match_its_content_md5_is_refused(seaweedfs_store: S3Store) -> None:
    k = key()
    other = base64.b64encode(hashlib.md5(b"other", usedforsecurity=False).digest()).decode()
    with pytest.raises(botocore.exceptions.ClientError) as err:
        seaweedfs_store.client.put_object(
            Bucket=seaweedfs_store.bucket, Key=k, Body=b"sent", ContentMD5=other
        )
    assert err.value.response["Error"]["Code"] == "BadDigest"
    assert seaweedfs_store.head(k) is None


def test_data_that_does_not_match_its_checksum_is_refused(seaweedfs_store: S3Store) -> None:
    k = key()
    with pytest.raises(StorageError):
        seaweedfs_store.put_checked(k, b"sent", CRC64NVME, digest(CRC64NVME, b"other"))
    assert seaweedfs_store.head(k) is None


def test_a_part_that_does_not_match_its_checksum_is_refused(seaweedfs_store: S3Store) -> None:
    k = key()
    upload = seaweedfs_store.create_multipart(k, CRC64NVME)
    try:
        with pytest.raises(StorageError):
            seaweedfs_store.upload_part(
                k, upload, 1, b"sent", CRC64NVME, digest(CRC64NVME, b"other")
            )
    finally:
        seaweedfs_store.abort_multipart(k, upload)
    assert seaweedfs_store.head(k) is None


def changed_on_the_way(
    store: S3Store, forged: bytes, headers: dict[str, str] | None = None
) -> None:
    """Makes each PutObject of ``store`` send ``forged`` instead of the body it signed, and
    ``headers`` instead of those it signed, as someone on the network path could."""

    def change(request: Any, **_: Any) -> None:
        request.body = forged
        request.headers["Content-Length"] = str(len(forged))
        for name, value in (headers or {}).items():
            request.headers[name] = value

    store.client.meta.events.register("before-send.s3.PutObject", change)


def test_a_small_write_changed_on_the_way_is_refused(seaweedfs_store: S3Store) -> None:
    """Its Content-MD5 and its body's SHA-256 are both signed; SeaweedFS checks the first."""
    k = key()
    changed_on_the_way(seaweedfs_store, b'{"step": 99}')
    with pytest.raises(StorageError):
        seaweedfs_store.put(k, b'{"step": 10}')
    assert seaweedfs_store.head(k) is None


def test_data_changed_on_the_way_with_its_checksum_is_refused(seaweedfs_store: S3Store) -> None:
    """The body goes unsigned, but its checksum header is signed: changing both breaks the
    signature."""
    k, sent, forged = key(), b"w" * 5000, b"f" * 5000
    changed_on_the_way(
        seaweedfs_store, forged, {"x-amz-checksum-crc64nvme": digest(CRC64NVME, forged)}
    )
    with pytest.raises(StorageError) as err:
        seaweedfs_store.put_checked(k, sent, CRC64NVME, digest(CRC64NVME, sent))
    assert "SignatureDoesNotMatch" in str(err.value)
    assert seaweedfs_store.head(k) is None
