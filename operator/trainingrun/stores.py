"""The operator's side of the bucket: one ``Store`` per (endpoint, region, credentials, bucket),
the run's credentials Secret re-read at most once per TTL, and the two reads a pass makes: the
run manifest (its newest committed checkpoint) and the choice of the checkpoint to resume from.
The operator writes one thing to the bucket: the fence in ``manifest.json``, taken for an
attempt before its pod exists (``take_fence``); the sync sidecars write the rest.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from trainingrun.api import CheckpointRef, StorageSpec
from trainingrun.commit import take_fence
from trainingrun.committed import Choice, choose_checkpoint, read_run_manifest
from trainingrun.decide.pod import RunRef, run_prefix
from trainingrun.manifest import RunManifest
from trainingrun.storage import (
    Credentials,
    CredentialsSecretError,
    Store,
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


OpenStore = Callable[[StorageSpec, Credentials | None], Store]


class MissingSecret(Exception):
    """The credentials Secret a run names does not exist or lacks a key."""


class SecretReader(Protocol):
    """``trainingrun.kube.Kube.get_secret_data``: the decoded data, None when absent."""

    def get_secret_data(self, namespace: str, name: str) -> dict[str, str] | None: ...


class RunStores:
    def __init__(
        self,
        secrets: SecretReader,
        secret_ttl_seconds: float,
        open_store: OpenStore = open_store,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._secrets = secrets
        self._ttl = secret_ttl_seconds
        self._open = open_store
        self._monotonic = monotonic
        self._secret_cache: dict[tuple[str, str], tuple[float, dict[str, str] | None]] = {}
        self._stores: dict[tuple[str | None, str | None, str, str], Store] = {}
        self._lock = threading.Lock()

    def store_for(self, namespace: str, storage: StorageSpec) -> Store:
        """The store of a run's bucket with the run's own credentials. Raises MissingSecret."""
        creds = None
        if storage.credentials_secret:
            data = self._secret(namespace, storage.credentials_secret)
            try:
                creds = secret_credentials(namespace, storage.credentials_secret, data)
            except CredentialsSecretError as e:
                raise MissingSecret(str(e)) from e
        fingerprint = (
            hashlib.sha256(f"{creds.access_key}:{creds.secret_key}".encode()).hexdigest()
            if creds
            else ""
        )
        key = (storage.endpoint, storage.region, fingerprint, parse_uri(storage.uri).bucket)
        store = self._stores.get(key)
        if store is None:
            # One at a time: botocore loads and parses the S3 service model for the first client
            # (~15 MB), and workers that all start at once would each load their own copy
            # (~90 MB more peak RSS with 8 workers).
            with self._lock:
                store = self._stores.get(key)
                if store is None:
                    store = self._stores[key] = self._open(storage, creds)
        return store

    def _secret(self, namespace: str, name: str) -> dict[str, str] | None:
        """The Secret's data, read at most once per TTL per Secret: every pass needs the
        credentials, and reading them each time loads the API server."""
        key = (namespace, name)
        now = self._monotonic()
        cached = self._secret_cache.get(key)
        if cached and now - cached[0] < self._ttl:
            return cached[1]
        data = self._secrets.get_secret_data(namespace, name)
        self._secret_cache[key] = (now, data)
        return data

    def read_manifest(self, ref: RunRef) -> RunManifest | None:
        """The run's manifest; None when nothing was committed yet. Raises MissingSecret,
        StorageError, ManifestError."""
        store = self.store_for(ref.namespace, ref.spec.checkpoint.storage)
        return read_run_manifest(store, parse_uri(run_prefix(ref)))

    def checkpoints(self, ref: RunRef) -> Checkpoints:
        """The run's manifest and its newest committed checkpoint. Raises as read_manifest."""
        manifest = self.read_manifest(ref)
        entry = manifest.latest if manifest else None
        if entry is None:
            return Checkpoints(True, manifest, None)
        uri = f"{run_prefix(ref)}/{entry.prefix}"
        # No layout recorded: the HF Trainer's checkpoint-<step>/ (all that version 1 wrote).
        fmt = entry.layout.format if entry.layout else "hf"
        latest = CheckpointRef(step=entry.step, uri=uri, time=entry.committed, format=fmt)
        return Checkpoints(True, manifest, latest)

    def take_fence(self, ref: RunRef, attempt: int) -> tuple[RunManifest, int]:
        """Takes the run's fence for ``attempt``: (the manifest as written, the attempt's
        epoch). Raises MissingSecret, StaleAttempt, StorageError, ManifestError."""
        store = self.store_for(ref.namespace, ref.spec.checkpoint.storage)
        return take_fence(store, parse_uri(run_prefix(ref)), ref.uid, attempt)

    def choose(self, ref: RunRef, bad: set[int], manifest: RunManifest | None) -> Choice:
        """The newest committed checkpoint that verifies, given the manifest just read."""
        store = self.store_for(ref.namespace, ref.spec.checkpoint.storage)
        return choose_checkpoint(store, parse_uri(run_prefix(ref)), bad, manifest)
