"""The ``Store`` of a Google Cloud Storage bucket, with google-cloud-storage (the JSON API).

- Versions are generations (decimal strings): create-only is ``ifGenerationMatch=0``,
  compare-and-swap ``ifGenerationMatch=<generation>``. ``get_with_etag`` takes the generation
  from its download's response, so bytes and version always belong together.
- GCS checks a CRC32C declared with an upload (400 on a mismatch) and no other algorithm, so
  checked writes refuse any other (``StorageRejected``: the capability probe moves on). The
  declared value is the caller's, sent as ``crc32c`` metadata with the library's checksum off.
- Multipart uploads are part objects named after key, upload and number (``part_name``),
  composed in order into the key (through intermediates past 32 parts) and then deleted.
  ``list_multipart`` finds them by name; ``list_objects`` leaves them out, as S3 lists no parts.
- Retries: google.api_core's, within the ``CallBudget``'s deadline; a plain ``put`` only with a
  generation condition (a blind retry could overwrite a newer version), the rest always. With a
  ``call_deadline``, each call, a listing's pages included, ends by it (``storage.deadline``).
- What the library's errors mean: ``gcs.errors.translate``. The client, its credentials and its
  HTTP pool: ``gcs.client``.
"""

from __future__ import annotations

import contextlib
import io
import re
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

from google.api_core import exceptions as gexc
from google.cloud.storage import retry as gcs_retry

from trainingrun.storage import base as sb
from trainingrun.storage import deadline as calldeadline
from trainingrun.storage.base import CallBudget, KeyNotFound, Location, StorageRejected
from trainingrun.storage.checksum import CRC32C, Algorithm
from trainingrun.storage.deadline import Bounded, Deadline, one_call
from trainingrun.storage.gcs.client import GCS_ENDPOINT, connector
from trainingrun.storage.gcs.errors import crc_shown, translate

MAX_COMPOSE = 32  # sources of one compose call (a GCS limit)
DELETERS = 8  # deletes under way at once (a sweep, a completed upload's parts)
STREAM_CHUNK = 8 << 20  # a part given as a stream is sent in requests of this size
_MARK = ".trainingrun-upload-"
_PIECE = re.compile(r"^(.+)\.trainingrun-upload-([0-9a-f]{32})-(?:p\d{5,}|c\d+-\d{5,})$")


def upload_prefix(key: str, upload_id: str) -> str:
    """The common start of every object an upload makes: its parts and intermediates."""
    return f"{key}{_MARK}{upload_id}-"


def part_name(key: str, upload_id: str, number: int) -> str:
    """The object of part ``number`` (zero-padded: the names sort in part order)."""
    return f"{upload_prefix(key, upload_id)}p{number:05d}"


def parse_piece(name: str) -> tuple[str, str] | None:
    """(key, upload id) of a part or intermediate object's name; None for any other object."""
    m = _PIECE.match(name)
    return (m[1], m[2]) if m else None


def compose_plan(
    key: str, sources: list[str], temp: Callable[[int, int], str]
) -> list[tuple[str, list[str]]]:
    """(destination, sources) compose steps, in order, that join ``sources`` into ``key`` with at
    most MAX_COMPOSE sources a call: the leading sources folded 32 at a time into intermediates
    named ``temp(level, index)`` until one call can take what is left."""
    steps: list[tuple[str, list[str]]] = []
    current, level = list(sources), 0
    while len(current) > MAX_COMPOSE:
        level, i = level + 1, 0
        joined: list[str] = []
        while len(joined) + len(current) - i > MAX_COMPOSE and len(current) - i > 1:
            steps.append((temp(level, len(joined)), current[i : i + MAX_COMPOSE]))
            joined.append(steps[-1][0])
            i += MAX_COMPOSE
        current = joined + current[i:]
    steps.append((key, current))
    return steps


class _Capped:
    """A file for download_to_file refusing more than ``cap`` bytes: the download stops there."""

    def __init__(self, where: str, cap: int) -> None:
        self.where, self.cap, self.buf = where, cap, bytearray()

    def write(self, data: bytes) -> int:
        self.buf += data
        if len(self.buf) > self.cap:
            raise sb.TooLarge(self.where, None, self.cap)
        return len(data)


class Blocks:
    """A file for download_to_file that hands the library's small writes on to ``sink`` in
    blocks of ``chunk``: one block in memory, whatever the range's length."""

    def __init__(self, sink: sb.Sink, chunk: int) -> None:
        self.sink, self.chunk, self.count, self.buf = sink, chunk, 0, bytearray()

    def write(self, data: bytes) -> int:
        self.buf += data
        while len(self.buf) >= self.chunk:
            self.sink(bytes(self.buf[: self.chunk]))
            del self.buf[: self.chunk]
            self.count += self.chunk
        return len(data)

    def flush(self) -> None:
        if self.buf:
            self.sink(bytes(self.buf))
            self.count += len(self.buf)
            self.buf.clear()


def _stream(data: Any) -> tuple[Any, int]:
    """(a readable stream, its length) of bytes or of a seekable stream at its start."""
    if isinstance(data, bytes | bytearray | memoryview):
        return io.BytesIO(data), len(data)
    start = data.tell()
    size = data.seek(0, io.SEEK_END) - start
    data.seek(start)
    return data, size


class GcsStore(sb.ServiceChecksBodies, Bounded):
    """The calls of one GCS bucket (storage.base.Store). The client is made at the first call, so
    that finding no credentials is an error of a call (StorageAccessDenied), as elsewhere."""

    scheme = "gs"

    def __init__(
        self,
        connect: Callable[[], Any],
        bucket: str,
        budget: CallBudget,
        endpoint: str = GCS_ENDPOINT,
    ) -> None:
        self.bucket = bucket
        self.call_deadline, self.endpoint = budget.call_deadline, endpoint
        self.max_get_bytes = sb.MAX_GET_BYTES
        self._connect = connect
        self._handle: Any = None
        self._lock = threading.Lock()
        self.retry = gcs_retry.DEFAULT_RETRY.with_timeout(budget.deadline)
        self.kw = {"timeout": (budget.connect_timeout, budget.read_timeout), "retry": self.retry}
        only_if = gcs_retry.is_generation_specified  # put: retried with a condition only
        self.conditional = gcs_retry.ConditionalRetryPolicy(self.retry, only_if, ["query_params"])

    def url(self, key: str) -> str:
        return f"gs://{self.bucket}/{key}"

    def _do(self, where: str, call: Callable[[Any], Any]) -> Any:
        """``call(bucket handle)``, its errors translated for ``where``."""
        try:
            with self._lock:
                if self._handle is None:
                    self._handle = self._connect().bucket(self.bucket)
            return call(self._handle)
        except Exception as e:
            url = self.url(where)
            missing = self._bucket_missing
            raise calldeadline.settle(
                e, url, partial(translate, e, url, self.bucket, missing)
            ) from e

    def _bucket_missing(self) -> bool:
        """Whether a bare 404 was the bucket's: a one-object listing (storage.objects.list, in
        the role the store needs, unlike buckets.get) answers 404 only then."""
        try:
            list(self._handle.list_blobs(max_results=1, timeout=self.kw["timeout"]))
        except gexc.NotFound:
            return True
        except Exception:
            return False
        return False

    def _meta(self, key: str) -> Any:
        """The object's metadata (a reloaded blob), or None when it does not exist."""
        try:
            blob = self._do(key, lambda b: b.blob(key))  # no call
            self._do(key, lambda _: blob.reload(**self.kw))
            return blob
        except KeyNotFound:
            return None

    def get(self, key: str) -> bytes | None:
        got = self.get_with_etag(key)
        return got[0] if got is not None else None

    @one_call
    def get_with_etag(self, key: str) -> tuple[bytes, str] | None:
        """(bytes, generation) of one download, or None: the generation is the response's, so
        it is that of the bytes however often the object is rewritten. Past max_get_bytes the
        download stops (TooLarge)."""
        out = _Capped(self.url(key), self.max_get_bytes)

        def call(b: Any) -> Any:
            blob = b.blob(key)
            blob.download_to_file(out, raw_download=True, **self.kw)
            return blob.generation

        try:
            generation = self._do(key, call)
        except KeyNotFound:
            return None
        if generation is None:
            raise StorageRejected(f"{self.url(key)}: the download named no generation")
        return bytes(out.buf), str(generation)

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
        """Writes ``data``: create-only with ``if_none_match``, compare-and-swap on the
        generation ``if_match``. Returns the new generation."""
        if if_match is not None and not if_match.isdigit():
            raise sb.PreconditionFailed(f"{self.url(key)}: {if_match!r} is no GCS generation")
        cond = int(if_match) if if_match is not None else (0 if if_none_match else None)

        def call(b: Any) -> str:
            blob, kw = b.blob(key), {"timeout": self.kw["timeout"], "retry": self.conditional}
            blob.upload_from_string(data, content_type=content_type, if_generation_match=cond, **kw)
            return str(blob.generation)

        return str(self._do(key, call))

    @one_call
    def head(self, key: str, algo: Algorithm | None = None) -> tuple[int, str | None] | None:
        """(size, GCS's CRC32C of the whole object when ``algo`` is CRC32C; composed objects
        have one too) or None."""
        blob = self._meta(key)
        if blob is None:
            return None
        crc = blob.crc32c if algo is not None and algo.name == CRC32C.name else None
        return int(blob.size or 0), crc

    def _upload_checked(self, name: str, data: Any, algo: Algorithm, crc: str) -> None:
        """Uploads ``data`` declaring ``crc`` as its CRC32C, which GCS checks."""
        sb.crc32c_only(self.url(name), algo)
        stream, size = _stream(data)

        def call(b: Any) -> str:
            blob = b.blob(name)
            blob.crc32c = crc
            if stream is data:  # a streamed part: requests of 8 MiB, not the default 100 MiB
                blob.chunk_size = STREAM_CHUNK
            # checksum=None: the declared CRC32C is ours, not one of the bytes as sent.
            blob.upload_from_file(
                stream, size=size, content_type="application/octet-stream", checksum=None, **self.kw
            )
            return str(blob.crc32c)

        stored = self._do(name, call)
        if stored != crc:  # the emulator forgets a declared CRC32C past an upload's first chunk
            self._delete_one(name)
            raise sb.ChecksumMismatch(
                f"{self.url(name)}: stored CRC32C {crc_shown(stored)} != {crc}"
            )

    @one_call
    def put_checked(self, key: str, data: bytes, algo: Algorithm, checksum: str) -> None:
        self._upload_checked(key, data, algo, checksum)

    def create_multipart(self, key: str, algo: Algorithm) -> str:
        """A fresh upload id (no call: an upload is its part objects)."""
        sb.crc32c_only(self.url(key), algo)
        return uuid.uuid4().hex

    def upload_part(
        self, key: str, upload_id: str, number: int, data: bytes, algo: Algorithm, checksum: str
    ) -> str:
        """Writes the part's object; its entry is the object's name."""
        name = part_name(key, upload_id, number)
        self._upload_checked(name, data, algo, checksum)
        return name

    @one_call
    def complete_multipart(
        self, key: str, upload_id: str, parts: list[Any], algo: Algorithm, full: str | None
    ) -> None:
        """Composes the parts in order into ``key``, then deletes them; with ``full``, the
        composed object's CRC32C must be it (else the object is deleted: ChecksumMismatch).
        A failed compose leaves the pieces to ``abort_multipart``."""
        names = sorted(str(p) for p in parts)
        if not names:
            raise StorageRejected(f"{self.url(key)}: a multipart upload needs a part")
        pre = upload_prefix(key, upload_id)
        steps = compose_plan(key, names, lambda level, i: f"{pre}c{level}-{i:05d}")
        for dest, sources in steps:
            composed = self._do(dest, partial(_composed, dest=dest, sources=sources, kw=self.kw))
        self.delete(names + [dest for dest, _ in steps[:-1]])
        if full is not None and composed.crc32c != full:
            self.delete([key])
            raise sb.ChecksumMismatch(
                f"{self.url(key)}: composed CRC32C {crc_shown(composed.crc32c)} != {full}"
            )

    def _list(self, prefix: str) -> Iterator[Any]:
        """The objects under ``prefix``, page by page (an error of any page translated); the
        pages share one deadline."""
        deadline = self.new_deadline()
        with calldeadline.within(deadline):
            pages = self._do(prefix, lambda b: b.list_blobs(prefix=prefix, **self.kw).pages)
        while True:
            with calldeadline.within(deadline):
                page = self._do(prefix, lambda _: next(pages, None))
            if page is None:
                return
            yield from page

    @one_call
    def abort_multipart(self, key: str, upload_id: str) -> None:
        """Deletes the upload's parts and intermediates; none left is no error."""
        with contextlib.suppress(sb.NotFound):
            self.delete([b.name for b in self._list(upload_prefix(key, upload_id))])

    @one_call
    def list_multipart(self, prefix: str) -> list[tuple[str, str]]:
        """(key, upload id) of the uploads with pieces under ``prefix``, found by name."""
        found = (parse_piece(b.name) for b in self._list(prefix))
        return list(dict.fromkeys(f for f in found if f is not None))

    def list_objects(self, prefix: str) -> Iterator[tuple[str, int]]:
        """(key, size) under ``prefix``, without the pieces of unfinished multipart uploads."""
        for blob in self._list(prefix):
            if parse_piece(blob.name) is None:
                yield blob.name, int(blob.size or 0)

    @one_call
    def read_range(
        self, key: str, start: int, end: int, sink: sb.Sink, chunk: int = 8 << 20
    ) -> int:
        """Streams bytes ``start``..``end`` into ``sink`` in blocks of ``chunk``, unchecked (a
        range has no checksum of its own; the caller checks the whole file)."""
        out = Blocks(sink, chunk)
        ranged = {"start": start, "end": end, "raw_download": True, "checksum": None, **self.kw}
        self._do(key, lambda b: b.blob(key).download_to_file(out, **ranged))
        out.flush()
        return out.count

    @one_call
    def delete(self, keys: list[str]) -> None:
        """Deletes ``keys``, DELETERS at a time; a key already gone is no error. One call a key:
        the emulator answers the JSON API's batch requests of this library with nothing."""
        one = partial(self._delete_one, deadline=calldeadline.current())  # the pool's threads
        with ThreadPoolExecutor(min(DELETERS, len(keys) or 1)) as pool:
            list(pool.map(one, keys))

    def _delete_one(self, key: str, deadline: Deadline | None = None) -> None:
        with calldeadline.within(deadline), contextlib.suppress(KeyNotFound):
            self._do(key, lambda b: b.delete_blob(key, **self.kw))


def _composed(b: Any, dest: str, sources: list[str], kw: Mapping[str, Any]) -> Any:
    """``dest`` composed of ``sources`` (at most 32), with its new metadata (crc32c)."""
    blob = b.blob(dest)
    blob.compose([b.blob(s) for s in sources], **kw)
    return blob


def open_gcs(
    location: Location,
    endpoint: str | None,
    secret: Mapping[str, str] | None,
    budget: CallBudget,
    pool: int = 16,
) -> GcsStore:
    """The store of ``location``'s bucket (``gcs.client`` makes its client). Raises
    StorageMisconfigured when the Secret's key file is refused or holds no key."""
    url, connect = connector(endpoint, secret, budget, pool)
    return GcsStore(connect, location.bucket, budget, url)
