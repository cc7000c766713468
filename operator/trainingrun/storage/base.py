"""What every object store gives the commit protocol, the transfer and the agents: the ``Store``
interface, the errors it raises, where a run lives (``Location``) and how long a call may take
(``CallBudget``). The stores themselves: ``s3.store`` (boto3), ``gcs.store``
(google-cloud-storage) and ``azure.store`` (azure-storage-blob); ``storage.open_store`` picks one
by the uri's scheme.

Every store decides in one place what its service's answers mean:

- not found: ``None`` from the reads (``KeyNotFound`` where absence is an error); a missing
  bucket or container: ``BucketNotFound``, raised by the reads too (a set-up error).
- a create-only or compare-and-swap write that lost: ``PreconditionFailed``.
- throttling, 5xx, timeouts, connection errors: retried with backoff within the ``CallBudget``,
  then ``StorageUnavailable``.
- denied or no credentials: ``StorageAccessDenied`` naming the store's own permission names.
- a checksum the service found wrong: ``ChecksumMismatch``; other refusals: ``StorageRejected``.
- a ``get`` past ``max_get_bytes``: ``TooLarge``, with no more than that many bytes read.
- a call of a budget with a ``call_deadline`` still unfinished by then: ``CallTimedOut``.

The endpoint is the tenant's choice and the operator calls it from its own network position, so
an error's message (what status and Events show) carries none of the endpoint's words: no reply
body, reason phrase or error message, and an error code only when it is a plain identifier
(``shown_code``). What the endpoint said goes to the error's ``detail``, escaped
(``escaped``), for the operator's log only (``log_text``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from trainingrun.storage.checksum import CRC32C, Algorithm

SCHEMES = ("s3", "gs", "az")


# The most of an endpoint's words an error keeps for the log, once escaped.
DETAIL_CHARS = 200
_IDENTIFIER = re.compile(r"[A-Za-z][A-Za-z0-9]{0,63}")
_URL = re.compile(r"\w+://\S+")


def escaped(text: object, limit: int = DETAIL_CHARS) -> str:
    """``text`` on one line, as a Python string literal shows it (newlines, carriage returns,
    escape codes and every other unprintable character as ``\\n``, ``\\x1b``...), cut to
    ``limit`` characters with "..." after: an endpoint's words in a log line can neither start
    a forged line nor drive the terminal."""
    out: list[str] = []
    size = 0
    for ch in str(text):
        shown = ch if ch.isprintable() and ch != "\\" else repr(ch)[1:-1]
        if size + len(shown) > limit:
            return "".join(out) + "..."
        out.append(shown)
        size += len(shown)
    return "".join(out)


def shown_code(code: object) -> str:
    """An endpoint's error code as a message may show it: a plain identifier (AccessDenied,
    ServerBusy) of at most 64 characters, else "" (the code stays in the detail)."""
    text = str(code or "")
    return text if _IDENTIFIER.fullmatch(text) else ""


class StorageError(Exception):
    """A storage failure; the message names the bucket or key and what to do, and never
    repeats the endpoint's words: those are in ``detail``, escaped, for the log only."""

    def __init__(self, message: str = "", detail: object = "") -> None:
        super().__init__(message)
        # Without URLs: a request's own (a SAS, an upload session) is a credential.
        self.detail = escaped(_URL.sub("<url>", str(detail))) if detail else ""


def log_text(error: BaseException) -> str:
    """What the operator's log says of ``error``: its message, and the endpoint's own words
    (escaped) where a store kept them."""
    detail = getattr(error, "detail", "")
    return f"{error} (the endpoint said: {detail})" if detail else str(error)


class StorageUnavailable(StorageError):
    """The endpoint did not answer or kept answering 429/5xx; retrying later may work."""


class CallTimedOut(StorageUnavailable):
    """A call of a budget with a ``call_deadline`` had not ended by then (the endpoint kept
    sending, slowly, or kept a listing going); retrying later may work."""

    def __init__(self, where: str, endpoint: str, seconds: float) -> None:
        super().__init__(
            f"{where}: {endpoint} did not finish answering within {seconds:g} s, the most one "
            "call may take (every attempt included); the call is given up and tried again later"
        )
        self.seconds = seconds


class StorageAccessDenied(StorageError):
    """Credentials missing or not allowed; retrying will not help."""


class PreconditionFailed(StorageError):
    """A conditional write lost (create-only, or compare-and-swap on a version)."""


class ChecksumMismatch(StorageError):
    """The endpoint received bytes that do not match the checksum sent with them."""


class StorageRejected(StorageError):
    """The request itself is wrong for this endpoint (a 4xx other than the above)."""


class TooLarge(StorageError):
    """An object is larger than the reader takes; ``size`` is None when the endpoint did not
    say (the read stopped at ``cap`` + 1 bytes)."""

    def __init__(self, where: str, size: int | None, cap: int) -> None:
        told = f"is {size} bytes" if size is not None else "is larger"
        super().__init__(f"{where} {told}, over the {cap} bytes this read takes")
        self.size = size
        self.cap = cap


class NotFound(StorageError):
    """The bucket or key does not exist."""


class BucketNotFound(NotFound):
    """The bucket (GCS, S3) or container (Azure) does not exist."""


class KeyNotFound(NotFound):
    """The key does not exist."""


def crc32c_only(where: str, algo: Algorithm) -> None:
    """GCS and Azure take CRC32C only (GCS checks it; on Azure the store does, the service
    checking Content-MD5): ``StorageRejected`` for another, so the capability probe moves on."""
    if algo.name != CRC32C.name:
        raise StorageRejected(f"{where}: this store takes CRC32C checksums only, not {algo.name}")


class StorageMisconfigured(Exception):
    """No client can be made of the run's endpoint, region and credentials: they must change."""


class CredentialsSecretError(StorageError):
    """The run's credentials Secret is missing, lacks a key, or holds one the store refuses."""


@dataclass(frozen=True)
class Location:
    """A run's place in a store: ``bucket`` is the S3 or GCS bucket or the Azure container,
    ``account`` the Azure storage account ("" elsewhere)."""

    bucket: str
    prefix: str  # without leading or trailing '/'
    scheme: str = "s3"
    account: str = ""

    def key(self, *parts: str) -> str:
        return "/".join(p.strip("/") for p in (self.prefix, *parts) if p.strip("/"))

    def relative(self, key: str) -> str:
        """``key`` relative to the prefix (the inverse of ``key``)."""
        return key[len(self.prefix) + 1 :] if self.prefix else key

    @property
    def root(self) -> str:
        """The uri of the bucket (container), without the prefix."""
        if self.scheme == "az":
            return f"az://{self.account}/{self.bucket}"
        return f"{self.scheme}://{self.bucket}"


@dataclass(frozen=True)
class CallBudget:
    """How long one call may take: ``attempts`` (the first one included) times the timeouts,
    plus jittered backoff between them. The read timeout bounds each wait for bytes, not a
    call: an endpoint sending a byte a second never trips it. ``call_deadline``, where set,
    bounds the call itself by the wall clock, every attempt and page of a listing included
    (``storage.deadline``); None: the timeouts only."""

    attempts: int
    connect_timeout: float
    read_timeout: float
    retry_mode: Literal["standard", "adaptive"] = "standard"
    call_deadline: float | None = None

    @property
    def deadline(self) -> float:
        """Seconds a call and its retries may take at most, backoff included (for SDKs that
        bound retries by time rather than count)."""
        most = self.attempts * (self.connect_timeout + self.read_timeout) + 2.0 * self.attempts
        return most if self.call_deadline is None else min(most, self.call_deadline)


# The sync sidecar, the restore and the user commands: one caller, one endpoint; riding out a
# throttling or failing-over endpoint (8 retries, ~9 minutes at worst) beats failing a checkpoint.
PATIENT_BUDGET = CallBudget(attempts=9, connect_timeout=5, read_timeout=60, retry_mode="adaptive")
# The operator: a handful of workers serve every run of every tenant, so a call gives up after
# 25 s by the wall clock at most, however slowly the endpoint sends (one that never answers:
# ~20 s, two waits of 10 s), and the pass is retried later.
# "standard", not "adaptive": adaptive's client-side rate limiter can sleep in the worker.
OPERATOR_BUDGET = CallBudget(attempts=2, connect_timeout=5, read_timeout=10, call_deadline=25)
# ``get`` reads JSON records, the manifests (trainingrun.checkpoint.manifest caps them at 4 and 8
# MiB);
# a larger object there is not one, and is refused before it is loaded.
MAX_GET_BYTES = 8 << 20

# What ``Store.read_range`` hands its blocks to.
Sink = Callable[[bytes | memoryview], None]


class Store(Protocol):
    """The calls of one bucket (container) the protocol, the transfer and the agents make.

    A version (``get_with_etag``, ``put``'s result, ``if_match``) is the store's own token: the
    S3 or Azure ETag, the GCS generation. Multipart uploads are S3 multipart uploads, GCS
    composed part objects, Azure staged blocks; a part's entry is the store's own and goes back
    to ``complete_multipart`` unchanged."""

    scheme: str
    bucket: str
    max_get_bytes: int

    def url(self, key: str) -> str:
        """``key`` as the user names it: s3://bucket/key, gs://bucket/key, az://acct/cont/key."""
        ...

    def get(self, key: str) -> bytes | None: ...

    def get_with_etag(self, key: str) -> tuple[bytes, str] | None: ...

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
        ``if_match`` (a version). Returns the new version."""
        ...

    def head(self, key: str, algo: Algorithm | None = None) -> tuple[int, str | None] | None:
        """(size, the stored full-object checksum in ``algo`` where the store keeps one and
        returns it, encoded as ``checksum.Algorithm.encode``), or None when there is none."""
        ...

    def put_checked(self, key: str, data: bytes, algo: Algorithm, checksum: str) -> None:
        """Writes ``data`` with its checksum, which the store checks; ``StorageRejected`` when
        the store does not take ``algo``."""
        ...

    def sign_bodies(self) -> None:
        """From now on, has each request's signature cover its body too: for an endpoint that
        ignores the checksums the bodies carry (the sidecar's capability probe finds out), which
        protects them where the endpoint checks signed bodies. A no-op where the bodies are
        checked some other way."""
        ...

    def create_multipart(self, key: str, algo: Algorithm) -> str: ...

    def upload_part(
        self, key: str, upload_id: str, number: int, data: bytes, algo: Algorithm, checksum: str
    ) -> Any:
        """One part (numbered from 1; ``data`` may be a seekable file-like object of the part's
        length), checked by the store against ``checksum``; returns its completion entry."""
        ...

    def complete_multipart(
        self, key: str, upload_id: str, parts: list[Any], algo: Algorithm, full: str | None
    ) -> None:
        """Completes the upload; with ``full`` (a combinable algorithm's checksum of the whole
        object) the store checks the whole object where it can."""
        ...

    def abort_multipart(self, key: str, upload_id: str) -> None: ...

    def list_multipart(self, prefix: str) -> list[tuple[str, str]]:
        """(key, upload id) of unfinished multipart uploads under ``prefix``."""
        ...

    def read_range(self, key: str, start: int, end: int, sink: Sink, chunk: int = 8 << 20) -> int:
        """Streams bytes ``start``..``end`` inclusive into ``sink``; returns how many came.
        A block handed to ``sink`` may be a view of a buffer the store reuses: valid during
        the call only."""
        ...

    def list_objects(self, prefix: str) -> Iterator[tuple[str, int]]:
        """(key, size) of every object under ``prefix``."""
        ...

    def delete(self, keys: list[str]) -> None:
        """Deletes ``keys``; a key already gone is no error."""
        ...


class ServiceChecksBodies:
    """``Store.sign_bodies`` of a store whose service checks the checksum every write carries
    (Cloud Storage: the CRC32C; Azure: the MD5): nothing to do."""

    def sign_bodies(self) -> None:
        return None
