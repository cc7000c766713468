"""The Azure Blob Storage store (azure-storage-blob, sync API). What the service's answers mean
is decided in ``errors`` (``classify`` and ``translate``); a 404 other than ContainerNotFound is
``None`` from the reads.

Checksums: Azure knows no CRC32C. Every write carries a Content-MD5 the service checks, and the
bytes sent are checked here against the caller's CRC32C (for a streamed part, those of the pass
that went out): what lands is what the manifest's CRC32C describes. It is kept as metadata
``trainingrun_crc32c`` where that is free, never returned by ``head`` (our claim, not the
service's). Multipart uploads are staged blocks.

Messages show the service's error code only when it is a plain identifier, and never its
message: both go to the error's ``detail`` (the log's). With a ``call_deadline``, each call, a
listing's pages included, ends by it (``storage.deadline``). The client: ``client``.
"""

from __future__ import annotations

import contextlib
import io
import re
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from azure.core import MatchConditions
from azure.core.exceptions import AzureError
from azure.storage.blob import BlobBlock, ContentSettings

from trainingrun.storage import checksum
from trainingrun.storage import deadline as calldeadline
from trainingrun.storage.azure.client import (
    container_client,
    credential,  # noqa: F401 - callers and tests name it here
)
from trainingrun.storage.azure.errors import classify, translate
from trainingrun.storage.base import (
    MAX_GET_BYTES,
    CallBudget,
    ChecksumMismatch,
    KeyNotFound,
    Location,
    NotFound,
    PreconditionFailed,
    ServiceChecksBodies,
    Sink,
    StorageError,
    StorageMisconfigured,
    StorageRejected,
    TooLarge,
    crc32c_only,
)
from trainingrun.storage.checksum import Algorithm
from trainingrun.storage.deadline import Bounded, one_call

CRC_METADATA = "trainingrun_crc32c"
BATCH = 256  # subrequests of one Blob Batch
_UPLOAD_ID = re.compile(r"[0-9a-f]{32}")
_PART_DIGITS = 5  # Azure commits at most 50,000 blocks to a blob


def block_id(upload_id: str, number: int) -> str:
    """The block id of part ``number``: all block ids of a blob must have one length, so it is
    the upload id's 32 hex digits and the part number in 5 digits (the SDK base64-encodes it).
    The upload id in it tells ``list_multipart`` whose blocks are staged."""
    if not _UPLOAD_ID.fullmatch(upload_id) or not 1 <= number < 10**_PART_DIGITS:
        raise ValueError(f"no block id of upload {upload_id!r} part {number}")
    return f"{upload_id}{number:0{_PART_DIGITS}d}"


def parse_block_id(block: str) -> tuple[str, int] | None:
    """(upload id, part number) of a block id ``block_id`` made, else None."""
    upload, number = block[:32], block[32:]
    if _UPLOAD_ID.fullmatch(upload) and len(number) == _PART_DIGITS and number.isdigit():
        return upload, int(number)
    return None


class SentCrc(io.RawIOBase):
    """A part's stream as the SDK reads it, with the CRC of the bytes of the pass that went out:
    the SDK reads it once for Content-MD5, then again to send it (and per retry), each time from
    the start; so a file changed between passes is caught here or by the service."""

    def __init__(self, inner: Any, algo: Algorithm) -> None:
        super().__init__()
        self._inner, self._algo, self.crc = inner, algo, 0
        self._start = self._pos = self._covered = int(inner.tell())
        self.length = int(inner.seek(0, io.SEEK_END)) - self._start
        inner.seek(self._start)

    def __len__(self) -> int:  # what is left, as requests takes it
        return self._start + self.length - self._pos

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self._pos = int(self._inner.seek(offset, whence))
        if self._pos == self._start:
            self.crc, self._covered = 0, self._start
        return self._pos

    def read(self, size: int | None = -1) -> bytes:
        data = bytes(self._inner.read(-1 if size is None else size))
        if self._pos == self._covered:
            self.crc = self._algo.update(data, self.crc)
            self._covered += len(data)
        self._pos += len(data)
        return data

    def sent(self) -> str | None:
        """The encoded CRC of the last whole pass, None when no pass was whole."""
        whole = self._covered == self._start + self.length
        return self._algo.encode(self.crc) if whole else None


def _size_guard(where: str, cap: int) -> Callable[[Any], None]:
    """A raw response hook refusing a GET whose object is over ``cap`` from its headers, before
    the SDK reads the body (the connection is closed rather than drained)."""

    def hook(pipeline_response: Any) -> None:
        http = pipeline_response.http_response
        if http.status_code in (200, 206):
            told = http.headers.get("Content-Range", "").rpartition("/")[2]
            size = int(told) if told.isdigit() else int(http.headers.get("Content-Length", 0))
            if size > cap:
                with contextlib.suppress(Exception):
                    http.internal_response.close()
                raise TooLarge(where, size, cap)

    return hook


def open_azure(
    location: Location,
    endpoint: str | None,
    secret: Mapping[str, str] | None,
    budget: CallBudget,
    pool: int = 16,
) -> AzureStore:
    """The store of ``location``'s container: at ``endpoint`` (an emulator's or a private
    endpoint's account URL) or the account's public one. Raises StorageMisconfigured."""
    account = location.account
    if not account:
        raise StorageMisconfigured("the storage uri names no account: az://ACCOUNT/CONTAINER/...")
    url = endpoint.rstrip("/") if endpoint else f"https://{account}.blob.core.windows.net"
    client = container_client(url, account, location.bucket, secret, budget, pool)
    return AzureStore(
        client, account, location.bucket, call_deadline=budget.call_deadline, endpoint=url
    )


class AzureStore(ServiceChecksBodies, Bounded):
    """Blob calls of one container (``storage.base.Store`` says what each does), one HTTP pool."""

    scheme = "az"

    def __init__(
        self,
        client: Any,
        account: str,
        container: str,
        max_get_bytes: int = MAX_GET_BYTES,
        call_deadline: float | None = None,
        endpoint: str = "the endpoint",
    ) -> None:
        self.client, self.account, self.bucket = client, account, container
        self.max_get_bytes = max_get_bytes
        self.call_deadline, self.endpoint = call_deadline, endpoint
        self.root = f"az://{account}/{container}"

    def url(self, key: str) -> str:
        return f"{self.root}/{key}"

    def _translate(self, err: Exception, key: str) -> StorageError:
        where = self.url(key)
        return calldeadline.settle(err, where, lambda: translate(err, where, self.root))

    def _call(self, key: str, method: str, *args: Any, absent: bool = False, **kw: Any) -> Any:
        """``method`` of the key's blob client, its errors translated; with ``absent``, None
        when the blob does not exist."""
        try:
            return getattr(self.client.get_blob_client(key), method)(*args, **kw)
        except TooLarge:
            raise
        except Exception as e:
            err = self._translate(e, key)
            if absent and isinstance(err, KeyNotFound):
                return None
            raise err from e

    def _check(self, key: str, data: bytes, algo: Algorithm, expected: str) -> None:
        if checksum.digest(algo, data) != expected:
            raise ChecksumMismatch(f"{self.url(key)}: the data is not what {expected} sums")

    def get(self, key: str) -> bytes | None:
        got = self.get_with_etag(key)
        return got[0] if got is not None else None

    @one_call
    def get_with_etag(self, key: str) -> tuple[bytes, str] | None:
        """(bytes, the ETag their download answered with). The SDK's first ranged GET tells the
        size: an object over the cap is refused then, before its body is read."""
        cap, where = self.max_get_bytes, self.url(key)
        hook = _size_guard(where, cap)
        down = self._call(key, "download_blob", absent=True, raw_response_hook=hook)
        if down is None:
            return None
        try:
            data = bytes(down.readall())
        except AzureError as e:
            raise self._translate(e, key) from e
        if len(data) > cap:  # the service did not tell the size right
            raise TooLarge(where, None, cap)
        return data, str(down.properties.etag)

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
        """One Put Blob; create-only: If-None-Match *, compare-and-swap: If-Match the ETag."""
        kw: dict[str, Any] = {"overwrite": not if_none_match or bool(if_match)}
        if if_match:
            kw.update(etag=if_match, match_condition=MatchConditions.IfNotModified)
        settings = ContentSettings(content_type=content_type)
        return str(self._upload(key, data, content_settings=settings, **kw)["etag"])

    def _upload(self, key: str, data: bytes, **kw: Any) -> Any:
        return self._call(key, "upload_blob", data, length=len(data), validate_content=True, **kw)

    @one_call
    def head(self, key: str, algo: Algorithm | None = None) -> tuple[int, str | None] | None:
        """(size, None): the CRC32C metadata is our own claim, so it is not returned."""
        props = self._call(key, "get_blob_properties", absent=True)
        return (int(props.size), None) if props is not None else None

    @one_call
    def put_checked(self, key: str, data: bytes, algo: Algorithm, checksum: str) -> None:
        crc32c_only(self.url(key), algo)
        self._check(key, data, algo, checksum)
        self._upload(key, data, overwrite=True, metadata={CRC_METADATA: checksum})

    def create_multipart(self, key: str, algo: Algorithm) -> str:
        """A new upload id; no call: staged blocks need no upload to be opened."""
        crc32c_only(self.url(key), algo)
        return uuid.uuid4().hex

    @one_call
    def upload_part(
        self, key: str, upload_id: str, number: int, data: bytes, algo: Algorithm, checksum: str
    ) -> str:
        """Stages block ``number``; returns its block id (the completion entry)."""
        crc32c_only(self.url(key), algo)
        block = block_id(upload_id, number)
        if isinstance(data, (bytes, bytearray, memoryview)):
            self._check(key, bytes(data), algo, checksum)
            self._call(key, "stage_block", block, data, len(data), validate_content=True)
            return block
        body = SentCrc(data, algo)
        self._call(key, "stage_block", block, body, body.length, validate_content=True)
        if body.sent() != checksum:
            raise ChecksumMismatch(
                f"{self.url(key)}: part {number} as sent sums {body.sent()}, not {checksum} "
                "(the file changed while it was read); its block stays uncommitted"
            )
        return block

    @one_call
    def complete_multipart(
        self, key: str, upload_id: str, parts: list[Any], algo: Algorithm, full: str | None
    ) -> None:
        """Commits the blocks in order; ``full`` is kept as metadata (Azure cannot check it;
        each part was checked as it was staged)."""
        crc32c_only(self.url(key), algo)
        blocks = [BlobBlock(block_id=p) for p in parts]
        meta = {CRC_METADATA: full} if full else None
        self._call(key, "commit_block_list", blocks, metadata=meta, validate_content=True)

    @one_call
    def abort_multipart(self, key: str, upload_id: str) -> None:
        """Drops the key's staged blocks: a create-only commit of an empty block list (a commit
        discards the blocks it does not name), then a delete of that empty blob by its ETag.
        Azure keeps staged blocks per blob, not per upload: all unfinished uploads of the key
        go (a key has one writer: its name holds the epoch and rank). Where a blob exists, its
        staged blocks stay until its next commit or for 7 days."""
        try:
            made = self._call(key, "commit_block_list", [], if_none_match="*")
            self._call(
                key, "delete_blob", etag=made["etag"], match_condition=MatchConditions.IfNotModified
            )
        except (NotFound, PreconditionFailed):
            pass

    @one_call
    def list_multipart(self, prefix: str) -> list[tuple[str, str]]:
        """(key, upload id) of the blobs under ``prefix`` with staged blocks and no data (listed
        as 0 bytes with uncommitted blobs included; their block lists name the uploads). Staged
        blocks of a blob that exists are not found: that would take a call per blob."""
        found: list[tuple[str, str]] = []
        try:
            for blob in self.client.list_blobs(prefix, include=["uncommittedblobs"]):
                if blob.size:
                    continue
                lists = self._call(blob.name, "get_block_list", "uncommitted", absent=True)
                ids = {parse_block_id(b.id) for b in (lists[1] if lists else [])}
                found += [(blob.name, u) for u in sorted({p[0] for p in ids if p})]
        except AzureError as e:
            raise self._translate(e, prefix) from e
        return found

    @one_call
    def read_range(self, key: str, start: int, end: int, sink: Sink, chunk: int = 8 << 20) -> int:
        """Bytes ``start``..``end`` in ranged GETs of GET_CHUNK (the client's setting, not
        ``chunk``), each pinned by the SDK to the ETag of the first."""
        if end < start:
            return 0
        down = self._call(key, "download_blob", start, end - start + 1, max_concurrency=1)
        done = 0
        try:
            for block in down.chunks():
                sink(block)
                done += len(block)
        except AzureError as e:
            raise self._translate(e, key) from e
        return done

    def list_objects(self, prefix: str) -> Iterator[tuple[str, int]]:
        """(key, size) under ``prefix``, a page at a time; the pages share one deadline."""
        deadline = self.new_deadline()
        with calldeadline.within(deadline):
            pages = self.client.list_blobs(name_starts_with=prefix).by_page()
        while True:
            with calldeadline.within(deadline):
                try:
                    page = next(pages, None)
                    blobs = None if page is None else list(page)
                except Exception as e:
                    raise self._translate(e, prefix) from e
            if blobs is None:
                return
            yield from ((str(blob.name), int(blob.size)) for blob in blobs)

    @one_call
    def delete(self, keys: list[str]) -> None:
        """Blob Batch deletes of up to 256 keys; a key already gone is no error. An endpoint
        that refuses batches gets one Delete Blob per key."""
        for i in range(0, len(keys), BATCH):
            chunk = keys[i : i + BATCH]
            try:
                answers = list(self.client.delete_blobs(*chunk, raise_on_any_failure=False))
            except AzureError as e:
                err = self._translate(e, chunk[0])
                if not isinstance(err, StorageRejected):
                    raise err from e
                for key in chunk:
                    with contextlib.suppress(KeyNotFound):
                        self._call(key, "delete_blob")
                continue
            for key, answer in zip(chunk, answers, strict=True):
                if answer.status_code >= 300:
                    code = str(answer.headers.get("x-ms-error-code", ""))
                    err = classify(answer.status_code, code, self.url(key), self.root)
                    if not isinstance(err, KeyNotFound):
                        raise err
