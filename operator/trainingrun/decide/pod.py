"""The pod of one attempt, as a plain dict: a pure function of the run, the attempt number, the
chosen checkpoint and the operator's agent settings.

Shape: the user's template with its ``trainer`` container; a restore init container (only when
resuming); the sync sidecar as a native sidecar (init container with ``restartPolicy: Always``);
an ``emptyDir`` checkpoint volume at ``spec.checkpoint.localPath`` in all three; the
``TRAININGRUN_*`` environment; credentials by ``secretKeyRef`` only; ``restartPolicy: Never``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from trainingrun.api import GROUP, KIND, TRAINER_CONTAINER, VERSION, TrainingRunSpec
from trainingrun.decide.classify import RESTORE_CONTAINER, SYNC_CONTAINER
from trainingrun.manifest import checkpoint_dirname, checkpoint_prefix

LABEL_RUN = "trainingrun.dev/run"
LABEL_ATTEMPT = "trainingrun.dev/attempt"
ANNOTATION_RESUME_STEP = "trainingrun.dev/resume-step"
CHECKPOINT_VOLUME = "trainingrun-checkpoints"
# The pod's annotations as a downward API file: how the sync sidecar sees the preemption notice
# the operator writes, without any Kubernetes API access of its own.
PODINFO_VOLUME = "trainingrun-podinfo"
PODINFO_DIR = "/etc/trainingrun/podinfo"
PODINFO_ANNOTATIONS = "annotations"
CREDENTIAL_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")


@dataclass(frozen=True)
class AgentSettings:
    """Operator-wide settings of the injected containers."""

    image: str = "ghcr.io/trainingrun/agent:0.1.0"
    image_pull_policy: str = "IfNotPresent"
    sync_command: tuple[str, ...] = ("trainingrun", "sync")
    restore_command: tuple[str, ...] = ("trainingrun", "restore")
    resources: dict[str, Any] = field(
        default_factory=lambda: {
            "requests": {"cpu": "100m", "memory": "128Mi"},
            "limits": {"memory": "512Mi"},
        }
    )


@dataclass(frozen=True)
class RunRef:
    name: str
    namespace: str
    uid: str
    spec: TrainingRunSpec


@dataclass(frozen=True)
class Resume:
    step: int
    uri: str


def pod_name(run_name: str, attempt: int) -> str:
    return f"{run_name}-{attempt}"


def owned_by(pod: dict[str, Any], run_uid: str) -> bool:
    """The pod is the run's own: its controller owner reference names the run's UID (a pod of
    the same name may be someone else's, or a deleted run's that is still going away)."""
    refs = (pod.get("metadata") or {}).get("ownerReferences") or []
    return any(
        r.get("uid") == run_uid and r.get("kind") == KIND and r.get("controller") for r in refs
    )


def run_prefix(run: RunRef) -> str:
    """s3://bucket/prefix/<namespace>/<run>: where this run's manifest and checkpoints live."""
    return f"{run.spec.checkpoint.storage.uri.rstrip('/')}/{run.namespace}/{run.name}"


def resume_of(run: RunRef, step: int | None) -> Resume | None:
    if step is None:
        return None
    return Resume(step=step, uri=f"{run_prefix(run)}/{checkpoint_prefix(step)}")


def _env(name: str, value: str) -> dict[str, Any]:
    return {"name": name, "value": value}


def storage_env(run: RunRef) -> list[dict[str, Any]]:
    """Environment that lets sync and restore reach the bucket; secrets by reference only."""
    storage = run.spec.checkpoint.storage
    env = [_env("TRAININGRUN_STORAGE_URI", run_prefix(run))]
    if storage.endpoint:
        env.append(_env("AWS_ENDPOINT_URL", storage.endpoint))
    if storage.region:
        env.append(_env("AWS_REGION", storage.region))
    if storage.credentials_secret:
        env.extend(
            {
                "name": key,
                "valueFrom": {"secretKeyRef": {"name": storage.credentials_secret, "key": key}},
            }
            for key in CREDENTIAL_KEYS
        )
    return env


def trainer_env(run: RunRef, attempt: int, resume: Resume | None) -> list[dict[str, Any]]:
    local = run.spec.checkpoint.local_path
    resume_from = f"{local.rstrip('/')}/{checkpoint_dirname(resume.step)}" if resume else ""
    return [
        _env("TRAININGRUN_NAME", run.name),
        _env("TRAININGRUN_ATTEMPT", str(attempt)),
        _env("TRAININGRUN_CHECKPOINT_DIR", local),
        _env("TRAININGRUN_RESUME_FROM", resume_from),
        _env("TRAININGRUN_RESUME_STEP", str(resume.step) if resume else ""),
        _env("TRAININGRUN_RESUME_URI", resume.uri if resume else ""),
    ]


def _merge_env(existing: list[dict[str, Any]], ours: list[dict[str, Any]]) -> list[dict[str, Any]]:
    names = {e["name"] for e in ours}
    return [e for e in existing if e.get("name") not in names] + ours


def _mount(path: str) -> dict[str, Any]:
    return {"name": CHECKPOINT_VOLUME, "mountPath": path}


def _agent(
    name: str, command: tuple[str, ...], env: list[dict[str, Any]], run: RunRef, s: AgentSettings
) -> dict[str, Any]:
    return {
        "name": name,
        "image": s.image,
        "imagePullPolicy": s.image_pull_policy,
        "command": list(command),
        "env": env,
        "volumeMounts": [_mount(run.spec.checkpoint.local_path)],
        "resources": copy.deepcopy(s.resources),
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
    }


def build_pod(
    run: RunRef, attempt: int, resume: Resume | None, settings: AgentSettings
) -> dict[str, Any]:
    """The pod of ``attempt`` (1-based) of ``run``, resuming from ``resume`` when given."""
    spec = run.spec
    template = copy.deepcopy(spec.template)
    meta = template.get("metadata") or {}
    pod_spec: dict[str, Any] = template.get("spec") or {}
    local = spec.checkpoint.local_path

    containers = []
    for original in pod_spec.get("containers") or []:
        c = dict(original)
        if c.get("name") == TRAINER_CONTAINER:
            c["env"] = _merge_env(list(c.get("env") or []), trainer_env(run, attempt, resume))
            mounts = [m for m in c.get("volumeMounts") or [] if m.get("name") != CHECKPOINT_VOLUME]
            c["volumeMounts"] = [*mounts, _mount(local)]
        containers.append(c)

    common = storage_env(run)
    sync_env = [
        *common,
        _env("TRAININGRUN_CHECKPOINT_DIR", local),
        _env("TRAININGRUN_KEEP", str(spec.checkpoint.keep)),
        _env("TRAININGRUN_ATTEMPT", str(attempt)),
        _env("TRAININGRUN_PODINFO_DIR", PODINFO_DIR),
        # The sidecar is stopped after the trainer, within the same grace period.
        _env(
            "TRAININGRUN_DRAIN_SECONDS",
            str(spec.preemption.termination_grace_period_seconds),
        ),
    ]
    init = []
    if resume:
        restore_env = [
            *common,
            _env("TRAININGRUN_CHECKPOINT_DIR", local),
            _env("TRAININGRUN_RESTORE_STEP", str(resume.step)),
        ]
        init.append(_agent(RESTORE_CONTAINER, settings.restore_command, restore_env, run, settings))
    sync = _agent(SYNC_CONTAINER, settings.sync_command, sync_env, run, settings)
    sync["restartPolicy"] = "Always"  # native sidecar: up before the trainer, down after it
    sync["volumeMounts"].append(
        {"name": PODINFO_VOLUME, "mountPath": PODINFO_DIR, "readOnly": True}
    )
    init.append(sync)

    ours = (CHECKPOINT_VOLUME, PODINFO_VOLUME)
    volumes = [v for v in pod_spec.get("volumes") or [] if v.get("name") not in ours]
    labels = {
        **(meta.get("labels") or {}),
        LABEL_RUN: run.name,
        LABEL_ATTEMPT: str(attempt),
    }
    annotations = dict(meta.get("annotations") or {})
    if resume:
        annotations[ANNOTATION_RESUME_STEP] = str(resume.step)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name(run.name, attempt),
            "namespace": run.namespace,
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": [
                {
                    "apiVersion": f"{GROUP}/{VERSION}",
                    "kind": KIND,
                    "name": run.name,
                    "uid": run.uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            **pod_spec,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": spec.preemption.termination_grace_period_seconds,
            "initContainers": [*(pod_spec.get("initContainers") or []), *init],
            "containers": containers,
            "volumes": [
                *volumes,
                {"name": CHECKPOINT_VOLUME, "emptyDir": {}},
                {
                    "name": PODINFO_VOLUME,
                    "downwardAPI": {
                        "items": [
                            {
                                "path": PODINFO_ANNOTATIONS,
                                "fieldRef": {"fieldPath": "metadata.annotations"},
                            }
                        ]
                    },
                },
            ],
        },
    }
