"""The hostile inputs of test_tenants.py: what one tenant of a shared operator may throw at it,
each with the outcome a user should see.

- ``REFUSED``: spec fields and template tricks the API server refuses at apply (the CRD's schema,
  its CEL rules, strict field validation), each with a word its message must contain;
- ``HOSTILE``: inputs the operator meets (storage a tenant may not use, Secrets missing or
  malformed, a key file naming its own token endpoint, manifests that are garbage, too big, too
  long, too new or naming 100,000,000 ranks, broken checkpoints, checkpoints with names no disk
  can hold or larger than the run's disk, a pod name taken, template annotations that fake the
  operator's signals, a root pod (its agents root with one capability), an init container that
  fakes the restore's exit), each with a ``Check`` of its outcome: failed with a reason,
  waiting with a reason, started from scratch with the bad checkpoint skipped, and so on;
- ``SLOW_ENDPOINTS``, in a namespace of their own: more runs on an endpoint that never answers
  than the operator has workers, and one on an endpoint that answers a byte every 2 s.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubernetes import client

from tests.e2e.tenancy import (
    GCS_BUCKET,
    MISSING_BUCKET,
    Blackhole,
    Trickle,
    base_uri,
    on_runner,
    tenant_run,
    tenant_run_key,
)
from tests.integration.support import Runs, commit_checkpoint
from tests.localenv import LocalEnv
from trainingrun import api
from trainingrun.checkpoint.manifest import RUN_MANIFEST, RUN_MANIFEST_MAX_BYTES
from trainingrun.contract import CHECKPOINT_VOLUME


@dataclass(frozen=True)
class Refused:
    """An input the API server refuses at apply: ``says`` is in its message."""

    name: str
    change: Callable[[dict[str, Any]], None]
    says: str


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(body: dict[str, Any]) -> None:
        keys = path.split(".")
        node = body
        for key in keys[:-1]:
            node = node.setdefault(key, {})
        node[keys[-1]] = value

    return change


def _container(extra: dict[str, Any]) -> Callable[[dict[str, Any]], None]:
    def change(body: dict[str, Any]) -> None:
        body["spec"]["template"]["spec"]["containers"][0].update(extra)

    return change


def _template(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(body: dict[str, Any]) -> None:
        body["spec"]["template"]["spec"][key] = value

    return change


STORAGE = "spec.checkpoint.storage"
REFUSED = [
    Refused("region-with-space", _set(f"{STORAGE}.region", "us east 1"), "region"),
    Refused("endpoint-underscore", _set(f"{STORAGE}.endpoint", "http://exa_mple:9000"), "endpoint"),
    Refused("endpoint-port", _set(f"{STORAGE}.endpoint", "http://example.com:99999"), "endpoint"),
    Refused("endpoint-userinfo", _set(f"{STORAGE}.endpoint", "http://u:p@example.com"), "endpoint"),
    Refused("uri-checkpoints", _set(f"{STORAGE}.uri", "s3://b/x/checkpoints/y"), "uri"),
    Refused("uri-dotdot", _set(f"{STORAGE}.uri", "s3://b/x/../y"), "uri"),
    Refused("uri-not-s3", _set(f"{STORAGE}.uri", "file:///etc"), "s3://"),
    Refused("container-reserved", _container({"name": "trainingrun-sync"}), "trainingrun-"),
    Refused(
        "init-reserved",
        _template("initContainers", [{"name": "trainingrun-restore", "image": "x"}]),
        "trainingrun-",
    ),
    Refused(
        "volume-reserved",
        _template("volumes", [{"name": CHECKPOINT_VOLUME, "emptyDir": {}}]),
        "trainingrun-",
    ),
    Refused("cpu-lots", _container({"resources": {"limits": {"cpu": "lots"}}}), "cpu"),
    Refused("typo-comand", _container({"comand": ["x"]}), "comand"),
    Refused("size-limit-huge", _set("spec.checkpoint.sizeLimit", "huge"), "sizeLimit"),
    Refused("max-restarts-negative", _set("spec.restartPolicy.maxRestarts", -1), "maxRestarts"),
    Refused("name-too-long", _set("metadata.name", "n" * 60), "52 characters"),
]


@dataclass
class Tenant:
    """The hostile tenant's namespace, its pod runner node and the bucket."""

    runs: Runs
    env: LocalEnv
    s3: Any
    node: str
    blackhole: Blackhole
    trickle: Trickle  # an allowed endpoint that answers a byte every 2 s
    token_trap: Trickle  # where a hostile key file sends its token requests: never called

    def run(self, name: str, **kwargs: Any) -> dict[str, Any]:
        return tenant_run(name, self.env, self.runs.namespace, **kwargs)

    def on_runner(self, body: dict[str, Any], script: str) -> dict[str, Any]:
        return on_runner(body, self.node, script)

    def key(self, name: str) -> str:
        return tenant_run_key(self.runs.namespace, name)

    def put_manifest(self, name: str, data: bytes) -> None:
        self.s3.put_object(
            Bucket=self.env.bucket, Key=f"{self.key(name)}/{RUN_MANIFEST}", Body=data
        )

    def condition(self, name: str, kind: str) -> dict[str, Any]:
        conditions = self.runs.status(name).get("conditions") or []
        return next((c for c in conditions if c["type"] == kind), {})


Check = Callable[[Tenant, str], str | None]  # None: the outcome holds; else what is seen


def failed(reason: str, says: str) -> Check:
    def check(t: Tenant, name: str) -> str | None:
        s = t.runs.status(name)
        if (
            s.get("phase") == "Failed"
            and s.get("reason") == reason
            and says in s.get("message", "")
        ):
            return None
        return f"phase {s.get('phase')} reason {s.get('reason')}: {s.get('message')}"

    return check


def waiting(reason: str, *says: str) -> Check:
    """Pending, held back with ``reason`` and a message that says one of ``says``."""

    def check(t: Tenant, name: str) -> str | None:
        c = t.condition(name, "Waiting")
        s = t.runs.status(name)
        if (
            c.get("status") == "True"
            and c.get("reason") == reason
            and any(text in c.get("message", "") for text in says)
            and s.get("reason") == reason
            and s.get("phase") == "Pending"
        ):
            return None
        return f"Waiting {c.get('status')} {c.get('reason')}: {c.get('message')}"

    return check


def pod_without_annotation(annotation: str) -> Check:
    def check(t: Tenant, name: str) -> str | None:
        pod = t.runs.pod(f"{name}-1")
        if pod is None:
            return "no pod yet"
        if annotation in (pod.metadata.annotations or {}):
            return f"the pod has {annotation}"
        return None

    return check


def fresh_skipping(step: int, says: str) -> Check:
    """Started from scratch, a CheckpointSkipped Event naming ``step`` and ``says``."""

    def check(t: Tenant, name: str) -> str | None:
        pod = t.runs.pod(f"{name}-1")
        skipped = [
            e.message
            for e in t.runs.events(name)
            if e.reason == "CheckpointSkipped" and f"checkpoint {step}" in e.message
        ]
        if pod is None or not skipped:
            return f"pod {pod is not None}, skipped {skipped}"
        if t.runs.env_of(pod).get("TRAININGRUN_RESUME_STEP"):
            return "resumed from a checkpoint"
        return None if says in skipped[0] else skipped[0]

    return check


def fresh_after_one_event_per_try(steps: int, tries: int) -> Check:
    """Started from scratch once all ``steps`` broken checkpoints were tried, each said in a
    ``CheckpointSkipped`` Event of at most ``tries`` of them, and recorded as bad."""

    def check(t: Tenant, name: str) -> str | None:
        pod = t.runs.pod(f"{name}-1")
        events = [e.message for e in t.runs.events(name) if e.reason == "CheckpointSkipped"]
        bad = t.runs.status(name).get("badCheckpoints") or []
        if pod is None or len(bad) < steps:
            return f"pod {pod is not None}, bad {bad}, {len(events)} Events"
        told = [m.count("checkpoint ") for m in events]
        if len(events) > -(-steps // tries) or max(told) > tries:
            return f"{len(events)} Events naming {told} checkpoints each"
        return "resumed" if t.runs.env_of(pod).get("TRAININGRUN_RESUME_STEP") else None

    return check


def agents_root_with_one_capability(t: Tenant, name: str) -> str | None:
    """A root pod: the pod's restore and sync run as root with ``DAC_OVERRIDE`` alone, every
    other capability dropped and no privilege escalation (they read what a root trainer keeps
    private; the template gives them nothing more)."""
    pod = t.runs.pod(f"{name}-1")
    if pod is None:
        return "no pod yet"
    seen = {}
    for container in pod.spec.init_containers or []:
        sc = container.security_context
        caps = sc.capabilities if sc else None
        seen[container.name] = (
            sc.run_as_user if sc else None,
            tuple(caps.add or ()) if caps else None,
            tuple(caps.drop or ()) if caps else None,
            sc.allow_privilege_escalation if sc else None,
        )
    wanted = (0, ("DAC_OVERRIDE",), ("ALL",), False)
    return None if seen and set(seen.values()) == {wanted} else f"agents' contexts {seen}"


def bad_then_fresh(step: int) -> Check:
    """The restore refused ``step``: marked bad, attempt 2 started from scratch."""

    def check(t: Tenant, name: str) -> str | None:
        s = t.runs.status(name)
        pod = t.runs.pod(f"{name}-2")
        if step in (s.get("badCheckpoints") or []) and pod is not None:
            return None if not t.runs.env_of(pod).get("TRAININGRUN_RESUME_STEP") else "resumed"
        return f"bad {s.get('badCheckpoints')}, attempt {s.get('attempt')}"

    return check


def restarts_exhausted(t: Tenant, name: str) -> str | None:
    s = t.runs.status(name)
    done = s.get("phase") == "Failed" and s.get("reason") == "RestartBudgetExhausted"
    if done and s.get("preemptions") == 0 and not s.get("badCheckpoints"):
        return None
    return f"{s.get('phase')} {s.get('reason')} preemptions {s.get('preemptions')}"


@dataclass(frozen=True)
class Hostile:
    """An input the operator meets: ``make`` creates it, ``check`` is its expected outcome."""

    name: str
    make: Callable[[Tenant, str], None]
    check: Check


def _create(shape: Callable[[Tenant, dict[str, Any]], None] = lambda t, b: None) -> Any:
    def make(t: Tenant, name: str) -> None:
        body = t.run(name)
        shape(t, body)
        t.runs.create(body)

    return make


def _storage(**fields: Any) -> Callable[[Tenant, str], None]:
    def shape(t: Tenant, body: dict[str, Any]) -> None:
        storage = body["spec"]["checkpoint"]["storage"]
        for key, value in fields.items():
            if value is None:
                storage.pop(key, None)
            else:
                storage[key] = value(t) if callable(value) else value

    return _create(shape)


def secret(name: str, data: dict[str, bytes]) -> client.V1Secret:
    """A Secret of raw bytes (``data``, not ``stringData``: they need not be text)."""
    encoded = {k: base64.b64encode(v).decode() for k, v in data.items()}
    return client.V1Secret(metadata=client.V1ObjectMeta(name=name), data=encoded)


def _with_secret(data: dict[str, bytes]) -> Callable[[Tenant, str], None]:
    def make(t: Tenant, name: str) -> None:
        t.runs.core.create_namespaced_secret(t.runs.namespace, secret(f"{name}-creds", data))
        body = t.run(name, secret=f"{name}-creds")
        t.runs.create(body)

    return make


def _manifest(data: Callable[[], bytes]) -> Callable[[Tenant, str], None]:
    def make(t: Tenant, name: str) -> None:
        t.put_manifest(name, data())
        t.runs.create(t.run(name))

    return make


def _checkpoints(
    files: dict[str, bytes], *, step: int = 5, script: str | None = None, **spec: Any
) -> Callable[[Tenant, str], None]:
    """A committed checkpoint ``step`` of ``files`` in the run's folder, then the run (on the
    pod runner when ``script`` is its trainer)."""

    def make(t: Tenant, name: str) -> None:
        commit_checkpoint(t.s3, t.env.bucket, t.key(name), step, files)
        body = t.run(name)
        body["spec"]["checkpoint"].update(spec)
        if script is not None:
            t.on_runner(body, script)
        t.runs.create(body)

    return make


def _on_runner(script: str, **shape: Any) -> Callable[[Tenant, str], None]:
    def make(t: Tenant, name: str) -> None:
        body = t.on_runner(t.run(name, restart_policy={"maxRestarts": 1}), script)
        template = body["spec"]["template"]
        template.setdefault("metadata", {}).update(shape.get("metadata", {}))
        template["spec"].update(shape.get("spec", {}))
        t.runs.create(body)

    return make


def _broken_entries(count: int) -> Callable[[Tenant, str], None]:
    """``count`` committed entries whose part records are missing."""

    def make(t: Tenant, name: str) -> None:
        entry = {"committed": "2026-01-01T00:00:00Z", "files": 1, "bytes": 1}
        entries = [
            {**entry, "step": i, "prefix": f"checkpoints/checkpoint-{i}/"}
            for i in range(1, count + 1)
        ]
        t.put_manifest(name, _manifest_json(entries=entries))
        t.runs.create(t.run(name))

    return make


def _gcs_key_file(t: Tenant, name: str) -> None:
    """A run on Cloud Storage whose Secret's key file sends token requests to a trap."""
    key = {
        "type": "service_account",
        "project_id": "p",
        "private_key_id": "k1",
        "private_key": "-----BEGIN PRIVATE KEY-----\nMIIB\n-----END PRIVATE KEY-----\n",
        "client_email": "sa@p.iam.gserviceaccount.com",
        "client_id": "1",
        "token_uri": f"{t.token_trap.url}/token",
    }
    data = {"GOOGLE_SERVICE_ACCOUNT_JSON": json.dumps(key).encode()}
    t.runs.core.create_namespaced_secret(t.runs.namespace, secret(f"{name}-creds", data))
    body = t.run(name, secret=f"{name}-creds")
    storage = body["spec"]["checkpoint"]["storage"]
    storage["uri"] = f"gs://{GCS_BUCKET}/{t.runs.namespace}"
    storage.pop("endpoint", None)
    storage.pop("region", None)
    t.runs.create(body)


def _name_taken(t: Tenant, name: str) -> None:
    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(name=f"{name}-1"),
        spec=client.V1PodSpec(containers=[client.V1Container(name="x", image="x")]),
    )
    t.runs.core.create_namespaced_pod(t.runs.namespace, pod)
    t.runs.create(t.run(name))


def _manifest_json(**fields: Any) -> bytes:
    return json.dumps({"version": 2, "entries": [], **fields}).encode()


def _many_entries() -> bytes:
    entry = {"step": 1, "prefix": "checkpoints/1/", "committed": "2026-01-01T00:00:00Z"}
    return _manifest_json(entries=[{**entry, "step": i} for i in range(1, 1500)])


BIG = b"x" * (2 << 20)  # 2 MiB: more than the sizeLimit below
NOTICE = f"{api.GROUP}/preemption-notice"
RESUME = f"{api.GROUP}/resume-step"
FAIL = "import sys; sys.exit(1)"
IDLE = "import time; time.sleep(600)"
BLACKHOLE_RUNS = 10  # more than the operator's 8 workers

# Calls beyond an endpoint's 4 at once, or the namespace's share of the workers, are not made
# at all: "busy or slow", "its share".
HELD = ("did not answer", "busy or slow", "its share of the operator's workers")
# Endpoints that hold the calls made to them, in a namespace of their own: its share of the
# operator's workers is taken by them, so its other runs would wait with them.
SLOW_ENDPOINTS = [
    *[
        Hostile(
            f"blackhole-{i}",
            _storage(endpoint=lambda t: t.blackhole.url),
            waiting("StorageUnavailable", *HELD),
        )
        for i in range(BLACKHOLE_RUNS)
    ],
    Hostile(
        "endpoint-trickles",
        _storage(endpoint=lambda t: t.trickle.url),
        # Each call ends by its wall-clock deadline, whatever the endpoint still sends.
        waiting("StorageUnavailable", *HELD),
    ),
]

HOSTILE = [
    Hostile(
        "endpoint-not-allowed",
        _storage(endpoint="http://169.254.169.254"),
        failed("StorageNotAllowed", "169.254.169.254"),
    ),
    Hostile(
        "endpoint-not-allowed-no-secret",
        _storage(endpoint="http://10.0.0.1:9000", credentialsSecret=None),
        failed("StorageNotAllowed", "10.0.0.1"),
    ),
    Hostile(
        "uri-outside-base",
        _storage(uri=lambda t: f"s3://{t.env.bucket}/elsewhere"),
        failed("StorageNotAllowed", "elsewhere"),
    ),
    Hostile(
        "uri-in-another-namespace",
        _storage(uri=lambda t: base_uri(t.env, "witness")),
        failed("StorageNotAllowed", "tenants/witness"),
    ),
    Hostile("checkpoints", _create(), failed("InvalidSpec", "checkpoints")),
    Hostile("manifest.json", _create(), failed("InvalidSpec", "manifest.json")),
    Hostile(
        "secret-missing",
        _storage(credentialsSecret="nowhere"),
        waiting("MissingSecret", "nowhere"),
    ),
    Hostile(
        "secret-without-key",
        _with_secret({"AWS_ACCESS_KEY_ID": b"k"}),
        waiting("MissingSecret", "AWS_SECRET_ACCESS_KEY"),
    ),
    Hostile(
        "secret-not-utf8",
        _with_secret({"AWS_ACCESS_KEY_ID": b"\xff\xfe", "AWS_SECRET_ACCESS_KEY": b"\xc3"}),
        waiting("MissingSecret", "UTF-8"),
    ),
    Hostile(
        "gcs-key-file-token-uri",
        _gcs_key_file,
        waiting("MissingSecret", "token_uri"),
    ),
    Hostile(
        "bucket-missing",
        _storage(uri=lambda t: f"s3://{MISSING_BUCKET}/{t.runs.namespace}"),
        waiting("StorageUnavailable", "does not exist"),
    ),
    Hostile(
        "manifest-garbage", _manifest(lambda: b"\x00not json{"), waiting("ManifestUnreadable", "")
    ),
    Hostile(
        "manifest-oversized",
        _manifest(lambda: b" " * (RUN_MANIFEST_MAX_BYTES + 1) + _manifest_json()),
        waiting("ManifestUnreadable", "bytes"),
    ),
    Hostile(
        "manifest-too-many-entries",
        _manifest(_many_entries),
        waiting("ManifestUnreadable", "checkpoints"),
    ),
    Hostile(
        "manifest-huge-rank-count",
        _manifest(
            lambda: _manifest_json(
                entries=[
                    {
                        "step": 5,
                        "prefix": "checkpoints/checkpoint-5/e1/",
                        "committed": "2026-01-01T00:00:00Z",
                        "files": 1,
                        "bytes": 1,
                        "epoch": 1,
                        "ranks": 100_000_000,
                    }
                ],
                fence=1,
            )
        ),
        waiting("ManifestUnreadable", "malformed"),
    ),
    Hostile("manifest-seven-broken", _broken_entries(7), fresh_after_one_event_per_try(7, 3)),
    Hostile(
        "manifest-newer-version",
        _manifest(lambda: _manifest_json(version=99)),
        waiting("ManifestUnreadable", "newer"),
    ),
    Hostile(
        "file-name-control-character",
        _checkpoints({"model\x1b[2J.bin": b"w"}),
        fresh_skipping(5, "printable"),
    ),
    Hostile(
        "file-name-too-long",
        _checkpoints({"m" * 200 + "/" + "n" * 100: b"w"}),
        fresh_skipping(5, "255"),
    ),
    Hostile(
        "names-a-and-a-b",
        _checkpoints({"a": b"1", "a/b": b"2"}, script=IDLE),
        bad_then_fresh(5),
    ),
    Hostile(
        "checkpoint-over-size-limit",
        _checkpoints({"big.bin": BIG}, script=IDLE, sizeLimit="1Mi"),
        failed("InsufficientDisk", "raise spec.checkpoint.sizeLimit"),
    ),
    Hostile("pod-name-taken", _name_taken, waiting("PodNameTaken", "")),
    Hostile(
        "pod-level-root",
        _on_runner(IDLE, spec={"securityContext": {"runAsUser": 0}}),
        agents_root_with_one_capability,
    ),
    Hostile(
        "template-resume-annotation",
        _on_runner(IDLE, metadata={"annotations": {RESUME: "999"}}),
        pod_without_annotation(RESUME),
    ),
    Hostile(
        "template-notice-annotation-failing-trainer",
        _on_runner(FAIL, metadata={"annotations": {NOTICE: "true"}}),
        restarts_exhausted,
    ),
    Hostile(
        "init-container-exits-3",
        _on_runner(
            IDLE,
            spec={
                "initContainers": [
                    {"name": "setup", "image": "t:1", "command": ["python", "-c", "exit(3)"]}
                ]
            },
        ),
        restarts_exhausted,
    ),
]
