"""The S3 store (boto3): AWS S3 and the S3-compatible stores (MinIO, Ceph, SeaweedFS, GCS
interoperability). ``s3.errors.translate`` decides in one place what 404, 412, 429 and 5xx mean;
429, 5xx, timeouts and connection errors are retried by botocore with jittered backoff within
the client's ``CallBudget`` first. With a ``call_deadline``, each call, a listing's pages
included, ends by it (``storage.deadline``).
"""

from __future__ import annotations

import http.client
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import boto3
import botocore.exceptions
from botocore.config import Config
from botocore.response import StreamingBody

from trainingrun.storage import deadline as calldeadline
from trainingrun.storage.base import (
    MAX_GET_BYTES,
    PATIENT_BUDGET,
    CallBudget,
    KeyNotFound,
    Location,
    NotFound,
    Sink,
    StorageError,
    StorageMisconfigured,
    TooLarge,
)
from trainingrun.storage.checksum import Algorithm
from trainingrun.storage.deadline import Bounded, one_call
from trainingrun.storage.s3.errors import delete_refusal, translate
from trainingrun.storage.s3.sign import content_md5, s3_config, sign_bodies, sign_unchecked_bodies

# A ranged GET is read 1 MiB at a time into one buffer. Reading it as botocore's chunks of
# 8 MiB costs a fresh 8 MiB allocation (page faults, zeroing) and two copies per chunk: on
# loopback the restore ran at a third of the speed (tests/bench_transfer.py, docs/benchmarks.md).
READ_BLOCK = 1 << 20

# Each worker thread reads into its own buffer, kept for its next range: a fresh 1 MiB per range
# is fresh memory for the kernel to map at first touch, 64 MiB of it per GiB restored.
_buffers = threading.local()


def _read_buffer(size: int) -> memoryview:
    view: memoryview | None = getattr(_buffers, "view", None)
    if view is None or len(view) < size:
        view = memoryview(bytearray(size))
        _buffers.view = view
    return view[:size]


def socket_reader(body: Any) -> Any:
    """The HTTP response under botocore's StreamingBody, to ``readinto`` a buffer straight from
    the connection: it stops at the response's Content-Length. None, and botocore's own reads,
    when the layers are not the ones this was written for (urllib3 2, http.client) or the body
    is encoded or checksummed on the way (botocore's response checksum validation)."""
    stream = getattr(body, "_raw_stream", None)
    fp = getattr(stream, "_fp", None)
    headers = getattr(stream, "headers", None) or {}
    if type(body) is not StreamingBody or not isinstance(fp, http.client.HTTPResponse):
        return None
    if headers.get("content-encoding") not in (None, "", "identity"):
        return None
    return fp


def _stream(body: Any, sink: Sink, chunk: int) -> int:
    """Hands a response body to ``sink`` block by block; returns how many bytes came."""
    done = 0
    reader = socket_reader(body)
    if reader is None:
        for block in body.iter_chunks(chunk):
            sink(block)
            done += len(block)
        return done
    view = _read_buffer(min(chunk, READ_BLOCK))
    while n := reader.readinto(view):
        sink(view[:n])
        done += n
    body.close()
    return done


@dataclass(frozen=True)
class Credentials:
    access_key: str
    secret_key: str

    def __repr__(self) -> str:  # never print the secret
        return "Credentials(access_key=***, secret_key=***)"


def make_client(
    endpoint: str | None = None,
    region: str | None = None,
    credentials: Credentials | None = None,
    max_pool_connections: int = 16,
    budget: CallBudget = PATIENT_BUDGET,
) -> Any:
    """A boto3 S3 client. Without ``credentials`` the standard AWS chain applies (env, web
    identity / IRSA, instance profile), refreshing as they expire."""
    config = Config(
        retries={"mode": budget.retry_mode, "total_max_attempts": budget.attempts},
        connect_timeout=budget.connect_timeout,
        read_timeout=budget.read_timeout,
        max_pool_connections=max_pool_connections,
        # boto3 >= 1.36 adds CRC checksums to every request by default; several S3-compatible
        # stores reject them. Send them only where the API requires them; callers that want a
        # checksum ask for one explicitly.
        # botocore's own AWS_REQUEST_CHECKSUM_CALCULATION / AWS_RESPONSE_CHECKSUM_VALIDATION
        # variables still win when set.
        request_checksum_calculation=(
            None if "AWS_REQUEST_CHECKSUM_CALCULATION" in os.environ else "when_required"
        ),
        response_checksum_validation=(
            None if "AWS_RESPONSE_CHECKSUM_VALIDATION" in os.environ else "when_required"
        ),
        s3=s3_config(endpoint),
    )
    kwargs: dict[str, Any] = {"config": config}
    if endpoint:
        kwargs["endpoint_url"] = endpoint
    if region:
        kwargs["region_name"] = region
    if credentials:
        kwargs["aws_access_key_id"] = credentials.access_key
        kwargs["aws_secret_access_key"] = credentials.secret_key
    client = boto3.client("s3", **kwargs)
    sign_unchecked_bodies(client)
    if budget.call_deadline is not None:
        calldeadline.bound_botocore(client)
    return client


def open_s3(
    location: Location,
    endpoint: str | None,
    region: str | None,
    credentials: Credentials | None,
    budget: CallBudget,
    pool: int,
) -> S3Store:
    """The S3 store of ``location``'s bucket. Raises StorageMisconfigured."""
    try:
        client = make_client(endpoint, region, credentials, pool, budget)
    except (ValueError, botocore.exceptions.BotoCoreError) as e:  # it names the value, not keys
        raise StorageMisconfigured(
            f"spec.checkpoint.storage: no S3 client can be made of it ({type(e).__name__}: {e})"
        ) from None
    return S3Store(
        client,
        location.bucket,
        call_deadline=budget.call_deadline,
        endpoint=client.meta.endpoint_url,
    )


def _unfinished_uploads(client: Any, bucket: str, prefix: str) -> list[tuple[str, str]]:
    """(key, upload id) of every unfinished multipart upload under ``prefix``, page after page
    (AWS gives at most 1,000 a page). MinIO lists a key's own uploads only, none under a
    folder's prefix (docs/storage-s3.md)."""
    pages = client.get_paginator("list_multipart_uploads").paginate(Bucket=bucket, Prefix=prefix)
    return [(str(u["Key"]), str(u["UploadId"])) for p in pages for u in p.get("Uploads") or []]


class S3Store(Bounded):
    """S3 calls for one bucket (``storage.base.Store`` says what each one does); each within
    ``call_deadline`` seconds when that is set (``storage.deadline``)."""

    scheme = "s3"

    def __init__(
        self,
        client: Any,
        bucket: str,
        max_get_bytes: int = MAX_GET_BYTES,
        call_deadline: float | None = None,
        endpoint: str | None = None,
    ) -> None:
        self.client = client
        self.bucket = bucket
        self.max_get_bytes = max_get_bytes
        self.call_deadline = call_deadline
        self.endpoint = endpoint or "the endpoint"

    def url(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"

    def _translate(self, err: Exception, key: str) -> StorageError:
        where = self.url(key)
        return calldeadline.settle(err, where, lambda: translate(err, where, self.bucket))

    def get(self, key: str) -> bytes | None:
        got = self._get(key)
        return got[0] if got is not None else None

    def get_with_etag(self, key: str) -> tuple[bytes, str] | None:
        got = self._get(key)
        return (got[0], str(got[1]["ETag"])) if got is not None else None

    @one_call
    def _get(self, key: str) -> tuple[bytes, dict[str, Any]] | None:
        try:
            resp = self.client.get_object(Bucket=self.bucket, Key=key)
            return self._capped(resp, key), resp
        except TooLarge:
            raise
        except Exception as e:
            err = self._translate(e, key)
            if isinstance(err, KeyNotFound):
                return None
            raise err from e

    def _capped(self, resp: dict[str, Any], key: str) -> bytes:
        """The body of a GET, refused unread when its length is over the cap, and read no
        further than one byte past it when the endpoint did not tell the length (or lied)."""
        body, cap = resp["Body"], self.max_get_bytes
        told = resp.get("ContentLength")
        if told is not None and int(told) > cap:
            body.close()  # the connection is dropped rather than drained
            raise TooLarge(self.url(key), int(told), cap)
        data: bytes = body.read(cap + 1)
        if len(data) > cap:
            body.close()
            raise TooLarge(self.url(key), None, cap)
        return data

    @one_call
    def put(
        self,
        key: str,
        data: bytes,
        *,
        if_none_match: bool = False,
        if_match: str | None = None,
        content_type: str = "application/json",
    ) -> str:
        """Writes ``data``; create-only with ``if_none_match``, compare-and-swap with
        ``if_match``. Returns the new ETag."""
        kwargs: dict[str, Any] = {
            "Bucket": self.bucket,
            "Key": key,
            "Body": data,
            "ContentType": content_type,
            "ContentMD5": content_md5(data),
        }
        if if_none_match:
            kwargs["IfNoneMatch"] = "*"
        if if_match:
            kwargs["IfMatch"] = if_match
        try:
            return str(self.client.put_object(**kwargs)["ETag"])
        except Exception as e:
            raise self._translate(e, key) from e

    @one_call
    def head(self, key: str, algo: Algorithm | None = None) -> tuple[int, str | None] | None:
        """(size, stored checksum in ``algo`` if the endpoint returns it), or None when the
        object does not exist."""
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Key": key}
        checksum_header = algo.header if algo else None
        if checksum_header:
            kwargs["ChecksumMode"] = "ENABLED"
        try:
            resp = self.client.head_object(**kwargs)
        except Exception as e:
            err = self._translate(e, key)
            if isinstance(err, KeyNotFound):
                return None
            raise err from e
        checksum = resp.get(checksum_header) if checksum_header else None
        if checksum and resp.get("ChecksumType") == "COMPOSITE":
            checksum = None  # a checksum of part checksums, not of the object
        return int(resp["ContentLength"]), checksum

    def sign_bodies(self) -> None:
        sign_bodies(self.client)

    @one_call
    def put_checked(self, key: str, data: bytes, algo: Algorithm, checksum: str) -> None:
        """Writes ``data`` with its full-object checksum; the endpoint rejects a mismatch."""
        try:
            self.client.put_object(
                Bucket=self.bucket, Key=key, Body=data, **{algo.header: checksum}
            )
        except Exception as e:
            raise self._translate(e, key) from e

    @one_call
    def create_multipart(self, key: str, algo: Algorithm) -> str:
        """An upload whose parts carry ``algo``; a combinable one makes the whole object's
        checksum the endpoint checks at completion (FULL_OBJECT)."""
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Key": key, "ChecksumAlgorithm": algo.name}
        if algo.combinable:
            kwargs["ChecksumType"] = "FULL_OBJECT"
        try:
            return str(self.client.create_multipart_upload(**kwargs)["UploadId"])
        except Exception as e:
            raise self._translate(e, key) from e

    @one_call
    def upload_part(
        self,
        key: str,
        upload_id: str,
        number: int,
        data: bytes,
        algo: Algorithm,
        checksum: str,
    ) -> dict[str, Any]:
        """One part, checked by the endpoint against ``checksum``; returns its completion entry."""
        try:
            resp = self.client.upload_part(
                Bucket=self.bucket,
                Key=key,
                UploadId=upload_id,
                PartNumber=number,
                Body=data,
                **{algo.header: checksum},
            )
        except Exception as e:
            raise self._translate(e, key) from e
        return {"PartNumber": number, "ETag": resp["ETag"], algo.header: checksum}

    @one_call
    def complete_multipart(
        self,
        key: str,
        upload_id: str,
        parts: list[Any],
        algo: Algorithm,
        full: str | None,
    ) -> None:
        """Completes the upload; with ``full`` the endpoint checks the whole object."""
        kwargs: dict[str, Any] = {
            "Bucket": self.bucket,
            "Key": key,
            "UploadId": upload_id,
            "MultipartUpload": {"Parts": parts},
        }
        if full:
            kwargs[algo.header] = full
            kwargs["ChecksumType"] = "FULL_OBJECT"
        try:
            self.client.complete_multipart_upload(**kwargs)
        except Exception as e:
            raise self._translate(e, key) from e

    @one_call
    def abort_multipart(self, key: str, upload_id: str) -> None:
        try:
            self.client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)
        except Exception as e:
            err = self._translate(e, key)
            if not isinstance(err, NotFound):
                raise err from e

    @one_call
    def list_multipart(self, prefix: str) -> list[tuple[str, str]]:
        try:
            return _unfinished_uploads(self.client, self.bucket, prefix)
        except Exception as e:
            raise self._translate(e, prefix) from e

    @one_call
    def read_range(self, key: str, start: int, end: int, sink: Sink, chunk: int = 8 << 20) -> int:
        """Streams bytes ``start``..``end`` inclusive of an object into ``sink`` in blocks of
        up to ``chunk``; returns how many bytes came. The blocks are views of one buffer, read
        into straight from the connection (``socket_reader``)."""
        try:
            resp = self.client.get_object(Bucket=self.bucket, Key=key, Range=f"bytes={start}-{end}")
            return _stream(resp["Body"], sink, chunk)
        except Exception as e:
            raise self._translate(e, key) from e

    def list_objects(self, prefix: str) -> Iterator[tuple[str, int]]:
        """(key, size) of every object under ``prefix``, a page at a time; the pages share
        one deadline."""
        deadline = self.new_deadline()
        with calldeadline.within(deadline):
            pages = iter(
                self.client.get_paginator("list_objects_v2").paginate(
                    Bucket=self.bucket, Prefix=prefix
                )
            )
        while True:
            with calldeadline.within(deadline):
                try:
                    page = next(pages, None)
                except Exception as e:
                    raise self._translate(e, prefix) from e
            if page is None:
                return
            for obj in page.get("Contents") or []:
                yield str(obj["Key"]), int(obj["Size"])

    @one_call
    def delete(self, keys: list[str]) -> None:
        for i in range(0, len(keys), 1000):
            chunk = [{"Key": k} for k in keys[i : i + 1000]]
            try:
                out = self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": chunk})
            except Exception as e:
                raise self._translate(e, keys[i]) from e
            # DeleteObjects answers 200 and lists the keys it could not delete.
            errors = out.get("Errors") or []
            if errors:
                first, asked = errors[0], keys[i : i + 1000]
                named = str(first.get("Key"))
                where = self.url(named if named in asked else asked[0])
                raise delete_refusal(where, first, len(errors), len(chunk))
