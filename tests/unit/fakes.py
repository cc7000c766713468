"""In-memory fakes of the operator's two outside systems, for unit tests of the reconciler:
``FakeKube`` plays ``trainingrun.operator.kube.Kube`` (runs, pods, nodes, Secrets, Events, with 409
on a
second create and merge-patch status writes), ``FakeBucket`` plays the object store a run's
manifest and checkpoints live in. ``Clock`` is the wall clock and the monotonic clock at once.
"""

from __future__ import annotations

import contextlib
import copy
import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast

import pytest
from moto import mock_aws

from tests.unit.builders import T0
from trainingrun.api import StorageSpec
from trainingrun.checkpoint.manifest import (
    CHECKPOINT_MANIFEST,
    RUN_MANIFEST,
    Layout,
    ManifestEntry,
    RunManifest,
    checkpoint_prefix,
    parse_run_manifest,
)
from trainingrun.contract import rfc3339
from trainingrun.operator.kube import ApiError
from trainingrun.operator.kubeconn import Connection, RestClient
from trainingrun.storage.checksum import CRC64NVME, Algorithm, digest
from trainingrun.storage.opener import (
    Credentials,
    Location,
    NotFound,
    PreconditionFailed,
    Store,
    make_client,
)

FILES = {"model.safetensors": b"weights" * 10, "trainer_state.json": b"{}"}


@dataclass
class Clock:
    at: datetime = T0
    ticks: float = 1000.0

    def now(self) -> datetime:
        return self.at

    def monotonic(self) -> float:
        return self.ticks

    def advance(self, seconds: float) -> None:
        self.at += timedelta(seconds=seconds)
        self.ticks += seconds


def _merge(target: dict[str, Any], patch: dict[str, Any]) -> None:
    """JSON merge patch (RFC 7386): None removes a key."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


class NoApi:
    """An API server that has nothing: the cache's read-through finds no object."""

    def get_run(self, namespace: str, name: str) -> dict[str, Any] | None:
        return None

    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        return None

    def get_node(self, name: str) -> dict[str, Any] | None:
        return None


@dataclass
class FakeKube:
    """A DELETE removes a pod at once (its kubelet is quick), unless a finalizer holds it
    (``hold``): then it gets a deletionTimestamp, as the API server sets it, and stays until
    ``release``. ``refuse_deletes[name] = n`` makes the next n DELETEs of a pod fail (ApiError)."""

    runs: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    services: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    pods: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    secrets: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (type, reason, message)
    creates: list[str] = field(default_factory=list)  # pod names, in order, 409s included
    deletes: list[tuple[str, int | None]] = field(default_factory=list)  # (pod, grace), refused too
    refuse_deletes: dict[str, int] = field(default_factory=dict)
    clock: Clock = field(default_factory=Clock)  # deletion and creation timestamps' time
    # Custom objects other than runs (Kueue's), by (plural, namespace or "", name).
    objects: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)
    served: set[str] = field(default_factory=set)  # plurals the API server serves (Kueue's)
    _version: int = 0

    def _rv(self) -> str:
        self._version += 1
        return str(self._version)

    def has_api(self, group: str, version: str, plural: str) -> bool:
        return plural in self.served

    def get_object(
        self, group: str, version: str, plural: str, name: str, namespace: str | None = None
    ) -> dict[str, Any] | None:
        found = self.objects.get((plural, namespace or "", name))
        return copy.deepcopy(found) if found else None

    def create_object(
        self, group: str, version: str, plural: str, body: dict[str, Any]
    ) -> dict[str, Any] | None:
        meta = body["metadata"]
        key = (plural, meta["namespace"], meta["name"])
        if key in self.objects:
            return None
        self.objects[key] = {**copy.deepcopy(body), "status": {}}
        self.objects[key]["metadata"]["resourceVersion"] = self._rv()
        return copy.deepcopy(self.objects[key])

    def replace_object_status(
        self, group: str, version: str, plural: str, body: dict[str, Any]
    ) -> None:
        meta = body["metadata"]
        self.objects[(plural, meta["namespace"], meta["name"])]["status"] = copy.deepcopy(
            body["status"]
        )

    def add_run(self, run: dict[str, Any]) -> None:
        meta = run["metadata"]
        meta["resourceVersion"] = self._rv()
        self.runs[(meta["namespace"], meta["name"])] = run

    def status_of(self, namespace: str, name: str) -> dict[str, Any]:
        return dict(self.runs[(namespace, name)].get("status") or {})

    def get_run(self, namespace: str, name: str) -> dict[str, Any] | None:
        run = self.runs.get((namespace, name))
        return copy.deepcopy(run) if run else None

    def patch_run_status(
        self, namespace: str, name: str, status: dict[str, Any]
    ) -> dict[str, Any] | None:
        run = self.runs.get((namespace, name))
        if run is None:
            return None
        _merge(run.setdefault("status", {}), status)
        run["metadata"]["resourceVersion"] = self._rv()
        return copy.deepcopy(run)

    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        pod = self.pods.get((namespace, name))
        return copy.deepcopy(pod) if pod else None

    def create_pod(self, pod: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        meta = pod["metadata"]
        key = (meta["namespace"], meta["name"])
        self.creates.append(meta["name"])
        if key in self.pods:
            return copy.deepcopy(self.pods[key]), False
        stored = copy.deepcopy(pod)
        stored["metadata"]["resourceVersion"] = self._rv()
        stored["metadata"].setdefault("uid", f"uid-{meta['name']}-{self._version}")
        stored["metadata"]["creationTimestamp"] = rfc3339(self.clock.now())
        stored["status"] = {"phase": "Pending"}
        self.pods[key] = stored
        return copy.deepcopy(stored), True

    def create_service(self, service: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        meta = service["metadata"]
        key = (meta["namespace"], meta["name"])
        if key in self.services:
            return copy.deepcopy(self.services[key]), False
        self.services[key] = copy.deepcopy(service)
        return copy.deepcopy(service), True

    def delete_pod_by_uid(
        self, namespace: str, name: str, uid: str | None, grace_seconds: int | None = None
    ) -> bool:
        self.deletes.append((name, grace_seconds))
        if self.refuse_deletes.get(name):
            self.refuse_deletes[name] -= 1
            raise ApiError("503 the server is currently unable to handle the request")
        pod = self.pods.get((namespace, name))
        if pod is None or (uid and pod["metadata"].get("uid") != uid):
            return False  # 404, or 409 on the UID precondition
        meta = pod["metadata"]
        if not meta.get("finalizers"):
            del self.pods[(namespace, name)]
            return True
        own = (pod.get("spec") or {}).get("terminationGracePeriodSeconds", 30)
        grace = own if grace_seconds is None else grace_seconds
        at = self.clock.now() + timedelta(seconds=grace)
        if meta.get("deletionTimestamp") is None or rfc3339(at) < meta["deletionTimestamp"]:
            # A shorter grace period than the one under way shortens it; a longer one does not.
            meta["deletionTimestamp"] = rfc3339(at)
            meta["deletionGracePeriodSeconds"] = grace
            meta["resourceVersion"] = self._rv()
        return True

    def hold(self, namespace: str, name: str, *finalizers: str) -> None:
        """Finalizers on the pod: a DELETE leaves it there, being deleted."""
        pod = self.pods[(namespace, name)]
        pod["metadata"]["finalizers"] = list(finalizers)
        pod["metadata"]["resourceVersion"] = self._rv()

    def release(self, namespace: str, name: str) -> None:
        """Its finalizers removed: a pod being deleted goes."""
        pod = self.pods[(namespace, name)]
        pod["metadata"].pop("finalizers", None)
        if pod["metadata"].get("deletionTimestamp"):
            del self.pods[(namespace, name)]

    def annotate_pod(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        pod = self.pods.get((namespace, name))
        if pod is not None:
            pod["metadata"].setdefault("annotations", {}).update(annotations)

    def get_node(self, name: str) -> dict[str, Any] | None:
        node = self.nodes.get(name)
        return copy.deepcopy(node) if node else None

    def get_secret_data(self, namespace: str, name: str) -> dict[str, str] | None:
        data = self.secrets.get((namespace, name))
        return dict(data) if data is not None else None

    def event(self, run: dict[str, Any], type_: str, reason: str, message: str) -> None:
        self.events.append((type_, reason, message))

    def set_pod(self, pod: dict[str, Any]) -> None:
        """What the kubelet reports of a pod (keeps the operator's labels and owner)."""
        meta = pod["metadata"]
        key = (meta["namespace"], meta["name"])
        stored = self.pods[key]
        stored["status"] = copy.deepcopy(pod.get("status") or {})
        if (pod.get("spec") or {}).get("nodeName"):
            stored["spec"]["nodeName"] = pod["spec"]["nodeName"]
        stored["metadata"]["resourceVersion"] = self._rv()
        for extra in ("deletionTimestamp", "deletionGracePeriodSeconds"):
            if extra in meta:
                stored["metadata"][extra] = meta[extra]


class DictStore:
    """The ``Store`` calls of the commit protocol over a dict of key -> bytes, with S3's
    conditional writes (If-None-Match, If-Match on an ETag that changes with every write):
    get, list, put, head (size, CRC64NVME of the bytes), delete, multipart listing. ``gets``
    records the keys read; ``deleted`` every key deleted. Its scheme is none of the real
    ones: the operator's fence reads back after its write here, as on Cloud Storage and Azure."""

    scheme = "memory"

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.etags: dict[str, str] = {}
        self.gets: list[str] = []
        self.signs_bodies = False
        self.deleted: list[str] = []
        self.uploads: list[tuple[str, str]] = []  # unfinished multipart uploads
        self._writes = 0

    def sign_bodies(self) -> None:
        self.signs_bodies = True

    def get(self, key: str) -> bytes | None:
        self.gets.append(key)
        return self.objects.get(key)

    def get_with_etag(self, key: str) -> tuple[bytes, str] | None:
        data = self.get(key)
        # An object set straight into ``objects`` by a test has the ETag "0".
        return None if data is None else (data, self.etags.get(key, '"0"'))

    def put(
        self,
        key: str,
        data: bytes,
        *,
        if_none_match: bool = False,
        if_match: str | None = None,
        content_type: str = "application/json",
    ) -> str:
        del content_type
        if if_none_match and key in self.objects:
            raise PreconditionFailed(f"{key}: exists")
        if if_match is not None and (
            key not in self.objects or self.etags.get(key, '"0"') != if_match
        ):
            raise PreconditionFailed(f"{key}: changed")
        self._writes += 1
        self.objects[key] = bytes(data)
        self.etags[key] = f'"{self._writes}"'
        return self.etags[key]

    def head(self, key: str, algo: Algorithm | None = None) -> tuple[int, str | None] | None:
        data = self.objects.get(key)
        if data is None:
            return None
        return len(data), digest(CRC64NVME, data) if algo else None

    def list_objects(self, prefix: str) -> Iterator[tuple[str, int]]:
        for key in sorted(self.objects):
            if key.startswith(prefix):
                yield key, len(self.objects[key])

    def delete(self, keys: list[str]) -> None:
        for key in keys:
            self.deleted.append(key)
            self.objects.pop(key, None)
            self.etags.pop(key, None)

    def list_multipart(self, prefix: str) -> list[tuple[str, str]]:
        return [(k, u) for k, u in self.uploads if k.startswith(prefix)]

    def abort_multipart(self, key: str, upload_id: str) -> None:
        self.uploads.remove((key, upload_id))

    def read_range(
        self, key: str, start: int, end: int, sink: Callable[[bytes], None], chunk: int = 8 << 20
    ) -> int:
        """The ranged GET the restore's downloads use: bytes ``start`` to ``end`` of ``key``."""
        data = self.objects.get(key)
        if data is None:
            raise NotFound(f"{key} does not exist")
        block = data[start : end + 1]
        sink(block)
        return len(block)


class FakeBucket(DictStore):
    """A run's bucket for the reconciler: opened by ``RunStores``, filled by ``commit``."""

    def __init__(self) -> None:
        super().__init__()
        self.opened: list[tuple[str | None, Credentials | None]] = []

    def open(self, storage: StorageSpec, credentials: Credentials | None) -> Store:
        """Stands in for ``storage.open_store``."""
        self.opened.append((storage.endpoint, credentials))
        return cast(Store, self)

    def commit(
        self,
        run: Location,
        *steps: int,
        files: dict[str, bytes] | None = None,
        at: str = "t",
        layout: Layout | None = None,
    ) -> None:
        """Checkpoints ``steps`` of the run at ``run`` (each holding ``files``), committed as
        the sync sidecar does, at time ``at`` in ``layout`` (None: HF's checkpoint-<step>/);
        manifest entries keep the order the steps came in."""
        files = FILES if files is None else files
        for step in steps:
            entries = [
                {
                    "path": path,
                    "size": len(data),
                    "checksum_algorithm": CRC64NVME.name,
                    "checksum": digest(CRC64NVME, data),
                }
                for path, data in files.items()
            ]
            for path, data in files.items():
                self.put(run.key(checkpoint_prefix(step), path), data)
            body = {"version": 1, "step": step, "files": entries, "created": "t"}
            key = run.key(checkpoint_prefix(step), CHECKPOINT_MANIFEST)
            self.put(key, json.dumps(body).encode())
        raw = self.objects.get(run.key(RUN_MANIFEST))
        before = parse_run_manifest(raw) if raw else RunManifest()
        old = [e.step for e in before.entries]
        added = [
            ManifestEntry(
                step=s,
                prefix=checkpoint_prefix(s),
                committed=at,
                files=len(files),
                bytes=1,
                layout=layout,
            )
            for s in steps
            if s not in old
        ]
        manifest = before.model_copy(update={"entries": [*before.entries, *added]})
        self.put(run.key(RUN_MANIFEST), manifest.to_json())


# The buckets of the ``moto_client`` fixture (tests/unit/conftest.py): ``store`` is on the first;
# the second has "bucket" in its name, which a missing key must not be mistaken for.
BUCKET, NAMED_BUCKET = "ckpt", "my-bucket"


@contextlib.contextmanager
def moto_s3(*buckets: str) -> Iterator[Any]:
    """moto's in-memory S3 (it honours If-None-Match and If-Match) and a client of it with
    ``buckets`` created, with no AWS setting of the machine in the way; no network."""
    with pytest.MonkeyPatch.context() as mp:
        for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_CONFIG_FILE"):
            mp.delenv(name, raising=False)
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
            mp.setenv(name, "testing")
        with mock_aws():
            client = make_client(region="us-east-1")
            for bucket in buckets:
                client.create_bucket(Bucket=bucket)
            yield client


def answer_json(handler: BaseHTTPRequestHandler, code: int, body: Any) -> None:
    """Writes ``body`` as a JSON answer with status ``code`` (a loopback API server's)."""
    raw = json.dumps(body).encode()
    handler.send_response(code)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(raw)))
    handler.end_headers()
    handler.wfile.write(raw)


@contextlib.contextmanager
def loopback_server(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """An HTTP server on 127.0.0.1 answering with ``handler``, on a thread; yields its URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def loopback_api_client(handler: type[BaseHTTPRequestHandler]) -> Iterator[RestClient]:
    """The operator's API client, its API server ``loopback_server(handler)``."""
    with loopback_server(handler) as url:
        rest = RestClient(Connection(server=url))
        try:
            yield rest
        finally:
            rest.close()
