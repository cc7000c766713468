"""The operator's side of the bucket: one ``Store`` per (endpoint, region, credentials, bucket),
the run's credentials Secret re-read at most once per TTL, and the two reads a pass makes: the
run manifest (its newest committed checkpoint) and the choice of the checkpoint to resume from.
The operator writes one thing to the bucket: the fence in ``manifest.json``, taken for an
attempt before its pod exists (``take_fence``); the sync sidecars write the rest.

A few workers serve every tenant's runs, so no endpoint and no namespace may hold them: the
operator's clients have a short budget (``storage.base.OPERATOR_BUDGET``, a wall-clock deadline per
call), at most ``max_in_flight`` calls go to one custom endpoint at a time, counted by the address
it resolves to, and at most ``max_per_namespace`` from one namespace
(``trainingrun.operator.slots``: one
more fails at once with ``EndpointBusy`` rather than wait), and the clients kept are the
``max_stores`` used last (each holds ~0.4 MiB).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol, cast
from urllib.parse import urlsplit

from trainingrun.api import CheckpointRef, StorageSpec
from trainingrun.checkpoint.capped import ManifestError, ManifestTooLarge, ManifestTooNew, fix
from trainingrun.checkpoint.commit import IfMatch, take_fence
from trainingrun.checkpoint.lookup import (
    Choice,
    ReadsTooSlow,
    choose_checkpoint,
    read_run_manifest_tagged,
)
from trainingrun.checkpoint.manifest import RunManifest
from trainingrun.checkpoint.progress import (
    LAST_WORD_RECORD,
    PROGRESS_RECORD,
    ProgressRecord,
    decode,
)
from trainingrun.decide.goodput import LEDGER_RECORD
from trainingrun.decide.naming import RunRef, run_prefix
from trainingrun.decide.storagepolicy import CLOUD, CLOUD_NAMES
from trainingrun.operator.slots import Addresses, Resolve, host_port, resolve
from trainingrun.operator.slots import EndpointBusy as EndpointBusy  # noqa: PLC0414 (re-exported)
from trainingrun.operator.slots import EndpointSlots as EndpointSlots  # noqa: PLC0414 (re-exported)
from trainingrun.storage.opener import (
    OPERATOR_BUDGET,
    BucketNotFound,
    ChecksumMismatch,
    CredentialsSecretError,
    Location,
    PreconditionFailed,
    SecretValues,
    StorageAccessDenied,
    StorageUnavailable,
    Store,
    TooLarge,
    open_store,
    parse_uri,
    secret_credentials,
)


@dataclass(frozen=True)
class Checkpoints:
    """What a pass read of the bucket: ``read`` is False when it did not (or could not)."""

    read: bool = False
    manifest: RunManifest | None = None
    latest: CheckpointRef | None = None  # the newest committed checkpoint, as status shows it
    # The manifest's bytes and ETag as read: the fence taken in the same pass starts from them.
    seen: tuple[bytes, str] | None = None


OpenStore = Callable[[StorageSpec, SecretValues | None], Store]
# endpoint, region, credentials' hash, the bucket's uri
StoreKey = tuple[str | None, str | None, str, str]


def open_operator_store(storage: StorageSpec, credentials: SecretValues | None) -> Store:
    """``storage.open_store`` with the operator's short budget: a call gives up within the
    deadline of ``storage.base.OPERATOR_BUDGET``."""
    return open_store(storage, credentials, OPERATOR_BUDGET)


class MissingSecret(Exception):
    """The credentials Secret a run names does not exist or lacks a key."""


def endpoint_of(storage: StorageSpec) -> str:
    """The endpoint a run's calls go to: its URL's scheme, host and port (lowercase; without a
    user or password, as it appears in messages), or the cloud's own service."""
    if not storage.endpoint:
        if storage.scheme != "s3":
            return CLOUD_NAMES[CLOUD[storage.scheme]]
        return f"AWS S3 ({storage.region or 'default region'})"
    url = urlsplit(storage.endpoint.strip().lower())
    try:
        port = f":{url.port}" if url.port else ""
    except ValueError:  # not a number: botocore refuses the URL anyway
        port = ""
    return f"{url.scheme}://{url.hostname or ''}{port}"


# How long a missing credentials Secret is taken as missing before it is read again.
ABSENT_SECRET_TTL_SECONDS = 5.0
# Committed checkpoints a start tries (newest first) before it stops and waits: each costs a
# read of every part record and a listing of every part, and a tenant's bucket may list 1000
# broken ones. The steps passed over are recorded as bad, so the next try reads older ones.
START_TRIES = 3


def limited(storage: StorageSpec) -> str | None:
    """The endpoint whose calls are limited: a custom one. AWS S3 itself, shared by every
    tenant on it and not one that stops answering, is not (a burst of starts would find its
    slots taken)."""
    return endpoint_of(storage) if storage.endpoint else None


def public_message(error: Exception, storage: StorageSpec) -> str:
    """What status and Events say of a failed bucket call: the operator's own words, the
    endpoint as ``endpoint_of`` names it and the run's uri; never text or a number the endpoint
    sent. The endpoint is the tenant's choice and the call comes from the operator's network
    position, so what a server there said (an error's text, a size, a body that is not a
    manifest) stays in the operator's log: an Event that echoed it would let a tenant probe the
    operator's network. What is wrong with a manifest is said in full from a cloud's own
    service, where it is the tenant's own bucket."""
    where, uri = endpoint_of(storage), storage.uri
    if isinstance(error, EndpointBusy | ReadsTooSlow):
        return str(error)  # the operator's own words and ``where``
    if isinstance(error, ManifestTooLarge):
        return f"{error.what} is over the cap of {error.cap} {error.unit}: {fix(error.what)}"
    if isinstance(error, ManifestError) and limited(storage) is None:
        return str(error)
    if isinstance(error, ManifestTooNew):
        return (
            f"{error.what} at {where} is of a version newer than the {error.newest} this build "
            "reads: upgrade the operator and agent images"
        )
    if isinstance(error, ManifestError):
        return (
            f"a manifest of the run at {where} is malformed (the operator's log has the "
            "details; `trainingrun checkpoints list` shows them too)"
        )
    said = next((s for kind, s in _SAID if isinstance(error, kind)), None)
    if said is None:
        return f"{where} refused a call under {uri} (the operator's log has the details)"
    return f"{where} {said.format(uri=uri)} (the operator's log has the details)"


# What each kind of failed call is said as, most specific first.
_SAID: tuple[tuple[type[Exception], str], ...] = (
    (StorageUnavailable, "did not answer, or answered with a server error"),
    (
        StorageAccessDenied,
        "denied the run's credentials access to {uri}: check "
        "spec.checkpoint.storage.credentialsSecret and the bucket's policy",
    ),
    (BucketNotFound, "says the bucket of {uri} does not exist: create it, or correct the uri"),
    (
        TooLarge,
        "holds an object under {uri} larger than the operator reads: a manifest there "
        "was not written by the sync sidecar",
    ),
    (ChecksumMismatch, "found a checksum wrong on a write under {uri}"),
    (PreconditionFailed, "refused a conditional write under {uri}: another writer changed it"),
)


class CountedStore:
    """A store that tells ``on_call(operation)`` of each call made through it (the operator's
    bucket calls metric); every call goes on to the store unchanged."""

    def __init__(self, store: Store, on_call: Callable[[str], None]) -> None:
        self._store = store
        self._on_call = on_call

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._store, name)
        if not callable(found):
            return found

        def counted(*args: Any, **kwargs: Any) -> Any:
            self._on_call(name)
            return found(*args, **kwargs)

        return counted


class SecretReader(Protocol):
    """``trainingrun.operator.kube.Kube.get_secret_data``: the decoded data, None when absent."""

    def get_secret_data(self, namespace: str, name: str) -> dict[str, str] | None: ...


class RunStores:
    def __init__(
        self,
        secrets: SecretReader,
        secret_ttl_seconds: float,
        open_store: OpenStore = open_operator_store,
        monotonic: Callable[[], float] = time.monotonic,
        max_stores: int = 128,
        max_in_flight: int = 4,
        on_call: Callable[[str], None] | None = None,
        max_per_namespace: int = 4,
        resolve: Resolve = resolve,
    ) -> None:
        self._secrets = secrets
        self._ttl = secret_ttl_seconds
        self._open = open_store
        self._monotonic = monotonic
        self._secret_cache: dict[tuple[str, str], tuple[float, dict[str, str] | None]] = {}
        self._stores: OrderedDict[StoreKey, Store] = OrderedDict()  # least recently used first
        self._max_stores = max_stores
        self._stores_lock = threading.Lock()  # the dict: held for a lookup or an insert
        self._if_matches: dict[tuple[str | None, str], IfMatch] = {}  # by endpoint and bucket
        self._open_lock = threading.Lock()  # making a client
        self.slots = EndpointSlots(
            max_in_flight, monotonic=monotonic, per_namespace=max_per_namespace
        )
        self.addresses = Addresses(resolve, monotonic=monotonic)
        self._on_call = on_call

    def store_for(self, namespace: str, storage: StorageSpec, fresh: bool = False) -> Store:
        """The store of a run's bucket with the run's own credentials; ``fresh``: with the
        Secret as it is now, not as cached. Raises MissingSecret."""
        creds = None
        location = parse_uri(storage.uri)
        if storage.credentials_secret:
            data = self._secret(namespace, storage.credentials_secret, fresh)
            try:
                creds = secret_credentials(
                    namespace, storage.credentials_secret, data, location.scheme
                )
            except CredentialsSecretError as e:
                raise MissingSecret(str(e)) from e
        fingerprint = creds.fingerprint() if creds else ""
        key = (storage.endpoint, storage.region, fingerprint, location.root)
        store = self._cached(key)
        if store is None:
            # One at a time: botocore loads and parses the S3 service model for the first client
            # (~15 MB), and workers that all start at once would each load their own copy
            # (~90 MB more peak RSS with 8 workers).
            with self._open_lock:
                store = self._cached(key)
                if store is None:
                    store = self._open(storage, creds)
                    if self._on_call is not None:
                        store = cast(Store, CountedStore(store, self._on_call))
                    self._keep(key, store)
        return store

    def _cached(self, key: StoreKey) -> Store | None:
        with self._stores_lock:
            store = self._stores.get(key)
            if store is not None:
                self._stores.move_to_end(key)
            return store

    def _keep(self, key: StoreKey, store: Store) -> None:
        """Caches ``store``, dropping the least recently used past ``max_stores`` (a run still
        using a dropped one finishes its call; its next pass makes a new client)."""
        with self._stores_lock:
            self._stores[key] = store
            while len(self._stores) > self._max_stores:
                self._stores.popitem(last=False)

    def _slot(self, namespace: str, storage: StorageSpec) -> AbstractContextManager[None]:
        """A slot for a call to the run's storage: of its endpoint, counted by the address its
        host resolves to, and of its namespace; none for a cloud's own service. Raises
        EndpointBusy."""
        endpoint = limited(storage)
        where = host_port(storage.endpoint) if storage.endpoint else None
        address = self.addresses.of(*where) if where else None
        return self.slots.hold(endpoint, namespace, address)

    def _secret(self, namespace: str, name: str, fresh: bool = False) -> dict[str, str] | None:
        """The Secret's data, read at most once per TTL per Secret: every pass needs the
        credentials, and reading them each time loads the API server. Its absence is trusted
        for ``ABSENT_SECRET_TTL_SECONDS`` only: a start waits for it (decide.waits), and goes on
        soon after it is created again."""
        key = (namespace, name)
        now = self._monotonic()
        cached = self._secret_cache.get(key)
        ttl = self._ttl if cached and cached[1] is not None else ABSENT_SECRET_TTL_SECONDS
        if cached and not fresh and now - cached[0] < min(ttl, self._ttl):
            return cached[1]
        try:
            data = self._secrets.get_secret_data(namespace, name)
        except UnicodeDecodeError:
            raise MissingSecret(
                f"Secret {namespace}/{name} named by spec.checkpoint.storage.credentialsSecret "
                "holds a value that is not UTF-8 text: store the keys as text"
            ) from None
        self._secret_cache[key] = (now, data)
        return data

    def read_manifest(self, ref: RunRef) -> RunManifest | None:
        """The run's manifest; None when nothing was committed yet. Raises MissingSecret,
        StorageError (EndpointBusy), ManifestError."""
        return self._read_tagged(ref)[0]

    def _read_tagged(self, ref: RunRef) -> tuple[RunManifest | None, tuple[bytes, str] | None]:
        storage = ref.spec.checkpoint.storage
        store = self.store_for(ref.namespace, storage)
        with self._slot(ref.namespace, storage):
            return read_run_manifest_tagged(store, parse_uri(run_prefix(ref)))

    def checkpoints(self, ref: RunRef) -> Checkpoints:
        """The run's manifest and its newest committed checkpoint. Raises as read_manifest."""
        manifest, seen = self._read_tagged(ref)
        entry = manifest.latest if manifest else None
        if entry is None:
            return Checkpoints(True, manifest, None, seen)
        uri = f"{run_prefix(ref)}/{entry.prefix}"
        # No layout recorded: the HF Trainer's checkpoint-<step>/ (all that version 1 wrote).
        fmt = entry.layout.format if entry.layout else "hf"
        latest = CheckpointRef(
            step=entry.step,
            uri=uri,
            time=entry.committed,
            format=fmt,
            bytes=entry.bytes,
            upload_seconds=entry.upload_seconds,
        )
        return Checkpoints(True, manifest, latest, seen)

    def read_progress(self, ref: RunRef, last_word: bool = False) -> ProgressRecord | None:
        """The progress record rank 0's sync sidecar published (``checkpoint.progress``), or
        with ``last_word`` the last one a sidecar published at its end; None when there is
        none yet. One GET under the run's slot and the operator's call deadline; the store
        refuses an object over its ``max_get_bytes`` unread, ``decode`` one over a few KiB.
        Raises MissingSecret, StorageError (EndpointBusy), ProgressError."""
        storage = ref.spec.checkpoint.storage
        store = self.store_for(ref.namespace, storage)
        key = LAST_WORD_RECORD if last_word else PROGRESS_RECORD
        with self._slot(ref.namespace, storage):
            data = store.get(parse_uri(run_prefix(ref)).key(key))
        return decode(data) if data is not None else None

    def read_ledger(self, ref: RunRef) -> bytes | None:
        """The goodput ledger's copy the operator put into the run's prefix (``LEDGER_RECORD``);
        None when there is none. One GET under the run's slot and the operator's call deadline;
        the store refuses an object over its ``max_get_bytes`` unread. Raises MissingSecret,
        StorageError."""
        storage = ref.spec.checkpoint.storage
        store = self.store_for(ref.namespace, storage)
        with self._slot(ref.namespace, storage):
            return store.get(parse_uri(run_prefix(ref)).key(LEDGER_RECORD))

    def write_ledger(self, ref: RunRef, data: bytes) -> None:
        """Puts the goodput ledger's copy (a plain PUT: a reader sees the old one or the new).
        Raises MissingSecret, StorageError."""
        storage = ref.spec.checkpoint.storage
        store = self.store_for(ref.namespace, storage)
        with self._slot(ref.namespace, storage):
            store.put(parse_uri(run_prefix(ref)).key(LEDGER_RECORD), data)

    def take_fence(
        self, ref: RunRef, attempt: int, seen: tuple[bytes, str] | None = None
    ) -> tuple[RunManifest, int]:
        """Takes the run's fence for ``attempt``: (the manifest as written, the attempt's
        epoch), from the manifest as ``seen`` in this pass when given (commit.take_fence).
        Raises MissingSecret, StaleAttempt, StorageError (EndpointBusy), ManifestError.
        The Secret is read afresh: the attempt's pod takes its keys from it, and a pod whose
        Secret is gone cannot start its containers, so a deleted Secret holds the start."""
        storage = ref.spec.checkpoint.storage
        store = self.store_for(ref.namespace, storage, fresh=True)
        location = parse_uri(run_prefix(ref))
        with self._slot(ref.namespace, storage):
            if_match = self._if_match(storage, location) if store.scheme == "s3" else None
            return take_fence(store, location, ref.uid, attempt, seen, if_match)

    def _if_match(self, storage: StorageSpec, location: Location) -> IfMatch:
        """What the fences found the endpoint and bucket of ``storage`` do with If-Match (S3
        only: Cloud Storage and Azure keep the read-back)."""
        with self._stores_lock:
            return self._if_matches.setdefault((storage.endpoint, location.bucket), IfMatch())

    def choose(self, ref: RunRef, bad: set[int], manifest: RunManifest | None) -> Choice:
        """The newest committed checkpoint that verifies among the START_TRIES newest not
        marked ``bad``, given the manifest just read. Raises as take_fence (ReadsTooSlow: it
        read for longer than committed.CHOOSE_SECONDS)."""
        storage = ref.spec.checkpoint.storage
        store = self.store_for(ref.namespace, storage)
        run = parse_uri(run_prefix(ref))
        with self._slot(ref.namespace, storage):
            return choose_checkpoint(
                store, run, bad, manifest, tries=START_TRIES, monotonic=self._monotonic
            )
