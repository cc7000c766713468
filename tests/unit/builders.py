"""Fluent builders of the plain data the decision code takes, so that a test states only what
matters to it.

- ``make_run("r1").with_checkpoint(120).with_restart_policy(max_restarts=1)``: a TrainingRun
  (spec, status, ``RunRef``, ``Observed``) whose bucket has checkpoint 120 committed.
- ``make_pod("r1-1").on_node("n1").trainer_exited(1)``: a pod dict in Kubernetes API JSON shape
  (camelCase): ``status.phase``, ``containerStatuses`` / ``initContainerStatuses`` with
  ``state.terminated`` / ``state.waiting``, ``conditions`` (``DisruptionTarget``),
  ``status.reason``, ``metadata.annotations`` and ``spec.nodeName``. ``pod_from(built)`` starts
  from a pod made by ``build_pod``, so its labels and resume annotation are the real ones.
- ``make_node("n1").not_ready().tainted(key)``: a node dict with a ``Ready`` condition and taints.

Every builder method returns the builder; ``build()`` (or ``spec()``, ``status()``...) returns a
fresh deep copy, so one builder can produce several variants without aliasing.
"""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any, Self

from trainingrun.api import (
    GROUP,
    KIND,
    VERSION,
    CheckpointRef,
    RestartPolicySpec,
    TrainingRunSpec,
    TrainingRunStatus,
)
from trainingrun.checkpoint.manifest import checkpoint_prefix
from trainingrun.contract import (
    ANNOTATION_NOTICE,
    RESTORE_CONTAINER,
    SYNC_CONTAINER,
    TRAINER_CONTAINER,
)
from trainingrun.decide.hold import Queue
from trainingrun.decide.naming import RunRef, run_prefix
from trainingrun.decide.observed import Observed

T0 = datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC)
NAMESPACE = "ml"
BUCKET_URI = "s3://ckpt-bucket/runs"
TRAINER_IMAGE = "ghcr.io/example/trainer:1.0"


def restart_policy(**fields: Any) -> RestartPolicySpec:
    """A RestartPolicySpec from snake_case fields; ``backoff`` may be a dict of its fields."""
    return RestartPolicySpec.model_validate(fields)


class RunBuilder:
    """A TrainingRun: its spec, its status, and what one reconcile pass observes of it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.namespace = NAMESPACE
        self.uid = f"uid-{name}"
        self.generation = 1
        self._template: dict[str, Any] = {
            "metadata": {"labels": {"team": "nlp"}, "annotations": {"owner": "alice"}},
            "spec": {
                "containers": [
                    {
                        "name": TRAINER_CONTAINER,
                        "image": TRAINER_IMAGE,
                        "command": ["python", "train.py"],
                    }
                ]
            },
        }
        self._checkpoint: dict[str, Any] = {"storage": {"uri": BUCKET_URI}}
        self._restart_policy: dict[str, Any] = {}
        self._preemption: dict[str, Any] = {}
        self._gang: dict[str, Any] = {}
        self._status: dict[str, Any] = {}
        self._latest: int | None = None
        self._latest_upload: tuple[int | None, float | None] = (None, None)
        self._suspend = False
        self._queue: Queue | None = None

    # -- the bucket -------------------------------------------------------------------------

    def with_checkpoint(
        self, step: int, size: int | None = None, upload_seconds: float | None = None
    ) -> Self:
        """The newest committed checkpoint in the bucket manifest is ``step``, of ``size``
        bytes whose upload took ``upload_seconds`` (None: not recorded)."""
        self._latest = step
        self._latest_upload = (size, upload_seconds)
        return self

    def without_checkpoint(self) -> Self:
        self._latest = None
        return self

    # -- spec -------------------------------------------------------------------------------

    def with_local_path(self, path: str) -> Self:
        self._checkpoint["localPath"] = path
        return self

    def with_checkpoint_fields(self, **fields: Any) -> Self:
        self._checkpoint.update(fields)
        return self

    def with_keep(self, keep: int) -> Self:
        self._checkpoint["keep"] = keep
        return self

    def with_storage(
        self,
        *,
        uri: str | None = None,
        endpoint: str | None = None,
        region: str | None = None,
        credentials_secret: str | None = None,
    ) -> Self:
        storage = self._checkpoint["storage"]
        for key, value in (
            ("uri", uri),
            ("endpoint", endpoint),
            ("region", region),
            ("credentialsSecret", credentials_secret),
        ):
            if value is not None:
                storage[key] = value
        return self

    def with_restart_policy(self, **fields: Any) -> Self:
        """snake_case fields of RestartPolicySpec; ``backoff`` may be a dict of its fields."""
        self._restart_policy.update(fields)
        return self

    def with_template_label(self, key: str, value: str) -> Self:
        self._template["metadata"]["labels"][key] = value
        return self

    def with_replicas(self, replicas: int, **gang: Any) -> Self:
        """A gang of ``replicas`` pods; ``gang``: snake_case fields of GangSpec."""
        self._gang = {"replicas": replicas, **({"gang": gang} if gang else {})}
        return self

    def with_grace_period(self, seconds: int) -> Self:
        self._preemption["termination_grace_period_seconds"] = seconds
        return self

    def with_notice_taints(self, *keys: str) -> Self:
        self._preemption["notice_taints"] = list(keys)
        return self

    def _trainer(self) -> dict[str, Any]:
        containers = self._template["spec"]["containers"]
        return next(c for c in containers if c["name"] == TRAINER_CONTAINER)

    def with_trainer_env(self, name: str, value: str) -> Self:
        self._trainer().setdefault("env", []).append({"name": name, "value": value})
        return self

    def with_volume(self, volume: dict[str, Any], mount_path: str) -> Self:
        """A user volume, mounted into the trainer at ``mount_path``."""
        self._template["spec"].setdefault("volumes", []).append(volume)
        self._trainer().setdefault("volumeMounts", []).append(
            {"name": volume["name"], "mountPath": mount_path}
        )
        return self

    def with_container(self, container: dict[str, Any]) -> Self:
        self._template["spec"]["containers"].append(container)
        return self

    def with_init_container(self, container: dict[str, Any]) -> Self:
        self._template["spec"].setdefault("initContainers", []).append(container)
        return self

    def with_pod_spec(self, **fields: Any) -> Self:
        """Extra fields of the template's pod spec (camelCase, as the user writes them)."""
        self._template["spec"].update(fields)
        return self

    def with_suspend(self, suspend: bool = True) -> Self:
        self._suspend = suspend
        return self

    def with_queue(self, admitted: bool, reason: str, message: str = "") -> Self:
        """Kueue's admission of the run's Workload, as the reconciler read it."""
        self._queue = Queue(admitted, reason, message or reason)
        return self

    def with_generation(self, generation: int) -> Self:
        self.generation = generation
        return self

    # -- status -----------------------------------------------------------------------------

    def with_status(self, **fields: Any) -> Self:
        """snake_case fields of TrainingRunStatus."""
        self._status.update(fields)
        return self

    # -- products ---------------------------------------------------------------------------

    def template(self) -> dict[str, Any]:
        return copy.deepcopy(self._template)

    def spec(self) -> TrainingRunSpec:
        data: dict[str, Any] = {
            "template": copy.deepcopy(self._template),
            "checkpoint": copy.deepcopy(self._checkpoint),
        }
        if self._restart_policy:
            data["restart_policy"] = copy.deepcopy(self._restart_policy)
        if self._preemption:
            data["preemption"] = copy.deepcopy(self._preemption)
        data.update(copy.deepcopy(self._gang))
        if self._suspend:
            data["suspend"] = True
        return TrainingRunSpec.model_validate(data)

    def ref(self) -> RunRef:
        return RunRef(name=self.name, namespace=self.namespace, uid=self.uid, spec=self.spec())

    def status(self) -> TrainingRunStatus:
        return TrainingRunStatus.model_validate(copy.deepcopy(self._status))

    def checkpoint_ref(self, step: int) -> CheckpointRef:
        """The CheckpointRef the controller makes of a committed manifest entry."""
        return CheckpointRef(
            step=step,
            uri=f"{run_prefix(self.ref())}/{checkpoint_prefix(step)}",
            time="2025-01-01T11:00:00Z",
            format="hf",
            bytes=self._latest_upload[0] if step == self._latest else None,
            upload_seconds=self._latest_upload[1] if step == self._latest else None,
        )

    def latest(self) -> CheckpointRef | None:
        return None if self._latest is None else self.checkpoint_ref(self._latest)

    def observe(
        self,
        pod: dict[str, Any] | None = None,
        *,
        node: dict[str, Any] | None = None,
        node_deleted: bool = False,
        status: TrainingRunStatus | None = None,
        now: datetime = T0,
    ) -> Observed:
        return Observed(
            name=self.name,
            generation=self.generation,
            spec=self.spec(),
            status=self.status() if status is None else status,
            pod=copy.deepcopy(pod),
            node=copy.deepcopy(node),
            node_deleted=node_deleted,
            latest=self.latest(),
            now=now,
            queue=self._queue,
        )


def make_run(name: str = "r1") -> RunBuilder:
    return RunBuilder(name)


class PodBuilder:
    """A pod of one attempt as the API server returns it (camelCase JSON)."""

    def __init__(self, name: str) -> None:
        self._pod: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE, "labels": {}, "annotations": {}},
            "spec": {
                "restartPolicy": "Never",
                "containers": [{"name": TRAINER_CONTAINER, "image": TRAINER_IMAGE}],
            },
            "status": {"phase": "Pending"},
        }

    @classmethod
    def of(cls, pod: dict[str, Any]) -> PodBuilder:
        """Starts from a pod made by ``build_pod``, status Pending."""
        builder = cls(pod["metadata"]["name"])
        builder._pod = copy.deepcopy(pod)
        builder._pod.setdefault("status", {"phase": "Pending"})
        return builder

    @property
    def _status(self) -> dict[str, Any]:
        status: dict[str, Any] = self._pod["status"]
        return status

    def _set_container(self, key: str, name: str, state: dict[str, Any], ready: bool) -> None:
        statuses = self._status.setdefault(key, [])
        entry = {
            "name": name,
            "image": TRAINER_IMAGE,
            "ready": ready,
            "restartCount": 0,
            "state": state,
        }
        for i, s in enumerate(statuses):
            if s["name"] == name:
                statuses[i] = entry
                return
        statuses.append(entry)

    def phase(self, phase: str) -> Self:
        self._status["phase"] = phase
        return self

    def on_node(self, node: str = "n1") -> Self:
        self._pod["spec"]["nodeName"] = node
        return self

    def annotated(self, key: str, value: str) -> Self:
        self._pod["metadata"]["annotations"][key] = value
        return self

    def owned_by(self, run: str, uid: str) -> Self:
        """The controller owner reference the operator sets on the pods it creates."""
        self._pod["metadata"]["ownerReferences"] = [
            {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "name": run, "uid": uid}
            | {"controller": True, "blockOwnerDeletion": True}
        ]
        return self

    def with_notice_annotation(self, value: str = "rebalance recommendation") -> Self:
        return self.annotated(ANNOTATION_NOTICE, value)

    def running(self, since: str = "2025-01-01T12:00:00Z") -> Self:
        """Scheduled on ``n1`` (unless placed already), sync sidecar and trainer running, both
        started at ``since`` (default T0: the pass sees a trainer that just started)."""
        self._pod["spec"].setdefault("nodeName", "n1")
        started = {"running": {"startedAt": since}}
        self._set_container("initContainerStatuses", SYNC_CONTAINER, started, ready=True)
        self._set_container("containerStatuses", TRAINER_CONTAINER, started, ready=True)
        return self.phase("Running")

    def trainer_exited(
        self,
        exit_code: int,
        *,
        reason: str | None = None,
        message: str | None = None,
        phase: str | None = None,
    ) -> Self:
        """The trainer terminated; the phase follows the exit code unless given."""
        self._pod["spec"].setdefault("nodeName", "n1")
        terminated: dict[str, Any] = {
            "exitCode": exit_code,
            "reason": reason or ("Completed" if exit_code == 0 else "Error"),
        }
        if message is not None:
            terminated["message"] = message
        state = {"terminated": terminated}
        self._set_container("containerStatuses", TRAINER_CONTAINER, state, ready=False)
        return self.phase(phase or ("Succeeded" if exit_code == 0 else "Failed"))

    def init_exited(self, name: str, exit_code: int, *, message: str | None = None) -> Self:
        """An init container terminated; a non-zero exit fails the pod."""
        self._pod["spec"].setdefault("nodeName", "n1")
        state = _terminated(exit_code, message)
        self._set_container("initContainerStatuses", name, state, ready=False)
        if exit_code != 0:
            self.phase("Failed")
        return self

    def restore_exited(self, exit_code: int, *, message: str | None = None) -> Self:
        return self.init_exited(RESTORE_CONTAINER, exit_code, message=message)

    def restore_beside_exited(self, exit_code: int, *, message: str | None = None) -> Self:
        """The restore beside the trainer (``restoreMode: AlongsideTrainer``) terminated; the
        pod's phase is left as it is (the trainer may still run)."""
        state = _terminated(exit_code, message)
        self._set_container("containerStatuses", RESTORE_CONTAINER, state, ready=False)
        return self

    def waiting(
        self, reason: str, *, container: str = TRAINER_CONTAINER, message: str | None = None
    ) -> Self:
        """A container (the trainer unless named) waits with ``reason``; the pod stays Pending."""
        waiting: dict[str, Any] = {"reason": reason}
        if message is not None:
            waiting["message"] = message
        key = "containerStatuses" if container == TRAINER_CONTAINER else "initContainerStatuses"
        self._set_container(key, container, {"waiting": waiting}, ready=False)
        return self

    def condition(
        self,
        ctype: str,
        status: str = "True",
        *,
        reason: str = "",
        message: str = "",
        at: str = "2025-01-01T11:30:00Z",
    ) -> Self:
        conditions = self._status.setdefault("conditions", [])
        conditions[:] = [c for c in conditions if c["type"] != ctype]
        conditions.append(
            {
                "type": ctype,
                "status": status,
                "reason": reason,
                "message": message,
                "lastTransitionTime": at,
            }
        )
        return self

    def created(self, at: str) -> Self:
        self._pod["metadata"]["creationTimestamp"] = at
        return self

    def scheduled(self, at: str) -> Self:
        """Bound to ``n1`` (unless placed already) at ``at`` (the PodScheduled condition)."""
        self._pod["spec"].setdefault("nodeName", "n1")
        return self.condition("PodScheduled", at=at)

    def disrupted(self, reason: str, message: str = "") -> Self:
        """The control plane marked the pod for disruption (``DisruptionTarget``)."""
        return self.condition("DisruptionTarget", "True", reason=reason, message=message)

    def ended_by(self, reason: str, message: str | None = None) -> Self:
        """``status.reason`` set by the kubelet or node controller (Evicted, Shutdown...)."""
        self._status["reason"] = reason
        if message is not None:
            self._status["message"] = message
        return self.phase("Failed")

    def build(self) -> dict[str, Any]:
        return copy.deepcopy(self._pod)


def make_pod(name: str = "r1-1") -> PodBuilder:
    return PodBuilder(name)


def pod_from(pod: dict[str, Any]) -> PodBuilder:
    return PodBuilder.of(pod)


class NodeBuilder:
    """A node with a Ready condition (True unless changed) and taints."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._ready = ("True", "KubeletReady")
        self._taints: list[dict[str, Any]] = []
        self._labels: dict[str, str] = {"kubernetes.io/hostname": name}

    def labelled(self, key: str, value: str) -> Self:
        self._labels[key] = value
        return self

    def not_ready(self, status: str = "False", reason: str = "KubeletNotReady") -> Self:
        self._ready = (status, reason)
        return self

    def unreachable(self) -> Self:
        """The node controller lost contact: Ready is Unknown."""
        return self.not_ready("Unknown", "NodeStatusUnknown")

    def tainted(self, key: str, effect: str = "NoSchedule", value: str | None = None) -> Self:
        taint: dict[str, Any] = {"key": key, "effect": effect}
        if value is not None:
            taint["value"] = value
        self._taints.append(taint)
        return self

    def build(self) -> dict[str, Any]:
        status, reason = self._ready
        node: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self._name, "labels": dict(self._labels)},
            "spec": {},
            "status": {
                "conditions": [
                    {
                        "type": "MemoryPressure",
                        "status": "False",
                        "reason": "KubeletHasSufficientMemory",
                    },
                    {"type": "Ready", "status": status, "reason": reason},
                ]
            },
        }
        if self._taints:
            node["spec"]["taints"] = copy.deepcopy(self._taints)
        return node


def _terminated(exit_code: int, message: str | None) -> dict[str, Any]:
    """A container state: terminated with ``exit_code`` (Completed or Error) and ``message``."""
    terminated: dict[str, Any] = {
        "exitCode": exit_code,
        "reason": "Completed" if exit_code == 0 else "Error",
    }
    if message is not None:
        terminated["message"] = message
    return {"terminated": terminated}


def make_node(name: str = "n1") -> NodeBuilder:
    return NodeBuilder(name)
