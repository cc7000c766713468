"""The pod of one attempt, as a plain dict: a pure function of the run, the attempt number, the
chosen checkpoint and the operator's agent settings.

Shape: the user's template with its ``trainer`` container; a restore init container (only when
resuming; a container beside the trainer with ``restoreMode: AlongsideTrainer``); the sync
sidecar as a native sidecar (init container with ``restartPolicy: Always``); an ``emptyDir``
checkpoint volume at ``spec.checkpoint.localPath`` in all three (with
``spec.checkpoint.sizeLimit`` when set); the ``TRAININGRUN_*`` environment; credentials by
``secretKeyRef`` only; ``restartPolicy: Never``. The two agents run hardened (``_agent``): no
privilege escalation, no capabilities, a read-only root, the RuntimeDefault seccomp profile,
as the trainer's user when the template names a non-root one, with their metrics served
where ``AgentSettings.metrics`` says (``decide.agents``).
The template's labels and annotations are kept except the operator's own (``trainingrun.dev/*``
and its subdomains): those are the signals it reads back from the pod, set by it alone.

A gang (``spec.replicas`` > 1) is one such pod per rank, ``<run>-<attempt>-<rank>``, with the
rank label, ``hostname`` and ``subdomain`` so that the run's headless Service (``build_service``)
gives each a DNS name, torchrun's ``PET_*`` environment in the trainer container (the master
address is rank 0's fully qualified name, ``master_addr``) and the rank in the sidecar's (each
rank's sidecar writes its own part of every checkpoint).
"""

from __future__ import annotations

import copy
import json
import posixpath
from dataclasses import dataclass, field
from typing import Any

from trainingrun import __version__
from trainingrun import contract as c
from trainingrun.api import GROUP, KIND, VERSION, TrainingRunSpec
from trainingrun.checkpoint.manifest import checkpoint_prefix
from trainingrun.contract import checkpoint_dirname
from trainingrun.decide.agents import agent_user, metrics_env, security_context
from trainingrun.decide.naming import (
    CLUSTER_DOMAIN,
    RunRef,
    master_addr,
    pod_name,
    run_prefix,
    service_name,
)


@dataclass(frozen=True)
class AgentSettings:
    """Operator-wide settings of the injected containers."""

    image: str = f"ghcr.io/trainingrun/agent:{__version__}"
    image_pull_policy: str = "IfNotPresent"
    sync_command: tuple[str, ...] = ("trainingrun", "sync")
    restore_command: tuple[str, ...] = ("trainingrun", "restore")
    # Where the sync sidecar serves its metrics: loopback (127.0.0.1, the default), pod (the
    # pod's IP, for a PodMonitor to scrape), or off.
    metrics: str = "loopback"
    # How long the sync sidecar goes on through nothing but access denied (credentials rotated
    # or revoked) before it exits, so the kubelet restarts it with the Secret's current keys.
    access_denied_seconds: int = 300
    # The cluster's DNS domain: a gang's master address is rank 0's fully qualified name in it.
    cluster_domain: str = CLUSTER_DOMAIN
    # How often at most rank 0's sidecar publishes the trainer's progress.
    progress_seconds: float = 60.0
    resources: dict[str, Any] = field(
        default_factory=lambda: {
            "requests": {"cpu": "100m", "memory": "128Mi"},
            "limits": {"memory": "512Mi"},
        }
    )


@dataclass(frozen=True)
class Resume:
    step: int
    uri: str
    path: str = ""  # what the trainer resumes from, relative to the checkpoint folder


def resume_of(run: RunRef, step: int | None, path: str | None = None) -> Resume | None:
    """The checkpoint an attempt resumes from; ``path``, where its layout puts what the trainer
    resumes from (relative to the checkpoint folder; the HF Trainer's ``checkpoint-<step>``
    when not given)."""
    if step is None:
        return None
    uri = f"{run_prefix(run)}/{checkpoint_prefix(step)}"
    return Resume(step=step, uri=uri, path=checkpoint_dirname(step) if path is None else path)


def reserved_key(key: str) -> bool:
    """A label or annotation key of the operator's own: prefix ``trainingrun.dev`` or a
    subdomain of it (as Kubernetes reserves ``kubernetes.io`` and ``*.kubernetes.io``)."""
    prefix, domain = key.partition("/")[0].lower(), c.RESERVED_DOMAIN
    return prefix == domain or prefix.endswith("." + domain)


def _users(keys: dict[str, Any] | None) -> dict[str, Any]:
    """The template's labels or annotations without the operator's keys: a pod's
    ``trainingrun.dev/*`` keys are signals the operator reads back (a preemption notice, the
    step it resumes from, a stop), which the user's template must not fake."""
    return {k: v for k, v in (keys or {}).items() if not reserved_key(k)}


def _env(name: str, value: str) -> dict[str, Any]:
    return {"name": name, "value": value}


def storage_env(run: RunRef) -> list[dict[str, Any]]:
    """Environment that lets sync and restore reach the bucket; secrets by reference only."""
    storage = run.spec.checkpoint.storage
    scheme = storage.scheme
    env = [_env(c.ENV_STORAGE_URI, run_prefix(run))]
    if storage.endpoint:
        name = c.ENV_AWS_ENDPOINT_URL if scheme == "s3" else c.ENV_STORAGE_ENDPOINT
        env.append(_env(name, storage.endpoint))
    if storage.region:
        env.append(_env(c.ENV_AWS_REGION, storage.region))
    if storage.credentials_secret:
        keys, all_needed = c.STORE_CREDENTIAL_KEYS[scheme]
        # Keys of which any one will do are optional: the Secret holds the one the user has.
        optional = {} if all_needed else {"optional": True}
        env.extend(
            {
                "name": key,
                "valueFrom": {
                    "secretKeyRef": {"name": storage.credentials_secret, "key": key, **optional}
                },
            }
            for key in keys
        )
    return env


def trainer_env(
    run: RunRef,
    attempt: int,
    resume: Resume | None,
    rank: int = 0,
    cluster_domain: str = CLUSTER_DOMAIN,
) -> list[dict[str, Any]]:
    local = run.spec.checkpoint.local_path
    resume_from = (posixpath.join(local, resume.path).rstrip("/") or "/") if resume else ""
    env = [
        _env(c.ENV_NAME, run.name),
        _env(c.ENV_ATTEMPT, str(attempt)),
        _env(c.ENV_CHECKPOINT_DIR, local),
        _env(c.ENV_RESUME_FROM, resume_from),
        _env(c.ENV_RESUME_STEP, str(resume.step) if resume else ""),
        _env(c.ENV_RESUME_URI, resume.uri if resume else ""),
    ]
    if resume and alongside(run.spec):
        env.append(_env(c.ENV_RESUME_WAIT, "1"))
    replicas = run.spec.replicas
    if replicas > 1:
        env += [
            _env(c.ENV_RANK, str(rank)),
            _env(c.ENV_REPLICAS, str(replicas)),
            _env(c.ENV_PET_NNODES, str(replicas)),
            _env(c.ENV_PET_NODE_RANK, str(rank)),
            _env(c.ENV_PET_MASTER_ADDR, master_addr(run, attempt, cluster_domain)),
            _env(c.ENV_PET_MASTER_PORT, str(run.spec.gang.master_port)),
        ]
    return env


def alongside(spec: TrainingRunSpec) -> bool:
    """The restore runs beside the trainer, not before it (``restoreMode``)."""
    return spec.checkpoint.restore_mode == "AlongsideTrainer"


def layout_env(spec: TrainingRunSpec) -> list[dict[str, Any]]:
    """The sidecar's checkpoint format (none for auto, the default) and pattern."""
    checkpoint = spec.checkpoint
    env = []
    if checkpoint.format != "auto":
        env.append(_env(c.ENV_CHECKPOINT_FORMAT, checkpoint.format))
    if checkpoint.format == "pattern" and checkpoint.pattern is not None:
        value = json.dumps(checkpoint.pattern.model_dump(), sort_keys=True)
        env.append(_env(c.ENV_CHECKPOINT_PATTERN, value))
    return env


def _owner(run: RunRef) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "name": run.name,
        "uid": run.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def build_service(run: RunRef) -> dict[str, Any]:
    """The headless Service of a gang: every pod of the run gets the DNS name
    ``<hostname>.<service>``, also before it is ready (the ranks meet before any probe passes)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": service_name(run.name),
            "namespace": run.namespace,
            "labels": {c.LABEL_RUN: run.name},
            "ownerReferences": [_owner(run)],
        },
        "spec": {
            "clusterIP": "None",
            "selector": {c.LABEL_RUN: run.name},
            "publishNotReadyAddresses": True,
            "ports": [{"name": "rendezvous", "port": run.spec.gang.master_port}],
        },
    }


def _merge_env(existing: list[dict[str, Any]], ours: list[dict[str, Any]]) -> list[dict[str, Any]]:
    names = {e["name"] for e in ours}
    return [e for e in existing if e.get("name") not in names] + ours


def _mount(path: str) -> dict[str, Any]:
    return {"name": c.CHECKPOINT_VOLUME, "mountPath": path}


def _agent(
    name: str,
    command: tuple[str, ...],
    env: list[dict[str, Any]],
    run: RunRef,
    s: AgentSettings,
    user: dict[str, Any],
) -> dict[str, Any]:
    return {
        "name": name,
        "image": s.image,
        "imagePullPolicy": s.image_pull_policy,
        "command": list(command),
        "env": [*env, *metrics_env(s.metrics)],
        "volumeMounts": [_mount(run.spec.checkpoint.local_path)],
        "resources": copy.deepcopy(s.resources),
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": security_context(user),
    }


def _one_per_node(affinity: dict[str, Any], run_name: str, attempt: int) -> dict[str, Any]:
    """A gang's pods on distinct nodes (a required anti-affinity to the attempt's other pods by
    hostname), unless the template places them itself with a podAntiAffinity of its own."""
    if "podAntiAffinity" in affinity:
        return affinity
    term = {
        "labelSelector": {"matchLabels": {c.LABEL_RUN: run_name, c.LABEL_ATTEMPT: str(attempt)}},
        "topologyKey": "kubernetes.io/hostname",
    }
    return {
        **affinity,
        "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]},
    }


def build_pod(
    run: RunRef,
    attempt: int,
    resume: Resume | None,
    settings: AgentSettings,
    epoch: int,
    rank: int = 0,
) -> dict[str, Any]:
    """The pod of ``rank`` of ``attempt`` (1-based) of ``run``, resuming from ``resume`` when
    given; its sidecar commits as ``epoch``, the fence the attempt holds."""
    spec = run.spec
    template = copy.deepcopy(spec.template)
    meta = template.get("metadata") or {}
    pod_spec: dict[str, Any] = template.get("spec") or {}
    local = spec.checkpoint.local_path

    containers = []
    user: dict[str, Any] = agent_user(pod_spec, None)
    for original in pod_spec.get("containers") or []:
        container = dict(original)
        if container.get("name") == c.TRAINER_CONTAINER:
            user = agent_user(pod_spec, container)
            env = list(container.get("env") or [])
            container["env"] = _merge_env(
                env, trainer_env(run, attempt, resume, rank, settings.cluster_domain)
            )
            mounts = container.get("volumeMounts") or []
            ours_out = [m for m in mounts if m.get("name") != c.CHECKPOINT_VOLUME]
            container["volumeMounts"] = [*ours_out, _mount(local)]
        containers.append(container)

    common = storage_env(run)
    sync_env = [
        *common,
        _env(c.ENV_CHECKPOINT_DIR, local),
        _env(c.ENV_KEEP, str(spec.checkpoint.keep)),
        _env(c.ENV_ATTEMPT, str(attempt)),
        _env(c.ENV_EPOCH, str(epoch)),
        _env(c.ENV_PODINFO_DIR, c.PODINFO_DIR),
        _env(c.ENV_ACCESS_DENIED_SECONDS, str(settings.access_denied_seconds)),
        _env(c.ENV_PROGRESS_SECONDS, f"{settings.progress_seconds:g}"),
        # The sidecar is stopped after the trainer, within the same grace period.
        _env(
            c.ENV_DRAIN_SECONDS,
            str(spec.preemption.termination_grace_period_seconds),
        ),
    ]
    if spec.replicas > 1:
        sync_env += [_env(c.ENV_RANK, str(rank)), _env(c.ENV_RANKS, str(spec.replicas))]
    sync_env += layout_env(spec)
    init: list[dict[str, Any]] = []
    if resume:
        restore_env = [
            *common,
            _env(c.ENV_CHECKPOINT_DIR, local),
            _env(c.ENV_RESTORE_STEP, str(resume.step)),
        ]
        if spec.checkpoint.size_limit:
            restore_env.append(_env(c.ENV_SIZE_LIMIT, spec.checkpoint.size_limit))
        if alongside(spec):
            restore_env.append(_env(c.ENV_RESUME_WAIT, "1"))
        restore = _agent(
            c.RESTORE_CONTAINER, settings.restore_command, restore_env, run, settings, user
        )
        # Alongside: the trainer's resume_from() waits for it (ENV_RESUME_WAIT).
        (containers if alongside(spec) else init).append(restore)
    sync = _agent(c.SYNC_CONTAINER, settings.sync_command, sync_env, run, settings, user)
    sync["restartPolicy"] = "Always"  # native sidecar: up before the trainer, down after it
    sync["volumeMounts"].append(
        {"name": c.PODINFO_VOLUME, "mountPath": c.PODINFO_DIR, "readOnly": True}
    )
    init.append(sync)

    empty_dir = {"sizeLimit": spec.checkpoint.size_limit} if spec.checkpoint.size_limit else {}
    ours = (c.CHECKPOINT_VOLUME, c.PODINFO_VOLUME)
    volumes = [v for v in pod_spec.get("volumes") or [] if v.get("name") not in ours]
    labels = {**_users(meta.get("labels")), c.LABEL_RUN: run.name, c.LABEL_ATTEMPT: str(attempt)}
    annotations = _users(meta.get("annotations"))
    if resume:
        annotations[c.ANNOTATION_RESUME_STEP] = str(resume.step)
    name = pod_name(run.name, attempt, rank, spec.replicas)
    network: dict[str, Any] = {}
    if spec.replicas > 1:
        labels[c.LABEL_RANK] = str(rank)
        if c.LABEL_KUEUE_QUEUE in labels:  # Kueue admits the attempt's pods as one group
            labels[c.LABEL_KUEUE_POD_GROUP] = pod_name(run.name, attempt)
            annotations[c.ANNOTATION_KUEUE_GROUP_COUNT] = str(spec.replicas)
        network = {
            "hostname": name,
            "subdomain": service_name(run.name),
            "affinity": _one_per_node(pod_spec.get("affinity") or {}, run.name, attempt),
        }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": run.namespace,
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": [_owner(run)],
        },
        "spec": {
            **pod_spec,
            **network,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": spec.preemption.termination_grace_period_seconds,
            "initContainers": [*(pod_spec.get("initContainers") or []), *init],
            "containers": containers,
            "volumes": [
                *volumes,
                {"name": c.CHECKPOINT_VOLUME, "emptyDir": empty_dir},
                {
                    "name": c.PODINFO_VOLUME,
                    "downwardAPI": {
                        "items": [
                            {
                                "path": c.PODINFO_ANNOTATIONS,
                                "fieldRef": {"fieldPath": "metadata.annotations"},
                            }
                        ]
                    },
                },
            ],
        },
    }
