"""The run as the pod builder sees it (``RunRef``), and the names of what its attempts make:
each pod (``<run>-<attempt>``, a gang's ``<run>-<attempt>-<rank>``), the gang's headless Service
and rank 0's fully qualified name (torchrun's master address), the run's prefix in its bucket,
and whether a pod is the run's own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainingrun.api import KIND, TrainingRunSpec

CLUSTER_DOMAIN = "cluster.local"  # the kubelet's default --cluster-domain


@dataclass(frozen=True)
class RunRef:
    name: str
    namespace: str
    uid: str
    spec: TrainingRunSpec


def pod_name(run_name: str, attempt: int, rank: int = 0, replicas: int = 1) -> str:
    """``<run>-<attempt>``, or ``<run>-<attempt>-<rank>`` for a gang."""
    return f"{run_name}-{attempt}" if replicas == 1 else f"{run_name}-{attempt}-{rank}"


def member_names(run: RunRef, attempt: int) -> list[str]:
    """The pod names of the attempt, by rank."""
    replicas = run.spec.replicas
    return [pod_name(run.name, attempt, rank, replicas) for rank in range(replicas)]


def service_name(run_name: str) -> str:
    """The run's headless Service (gangs): the ``subdomain`` of its pods."""
    return run_name


def master_addr(run: RunRef, attempt: int, cluster_domain: str = CLUSTER_DOMAIN) -> str:
    """Rank 0's fully qualified DNS name, ``<run>-<attempt>-0.<service>.<namespace>.svc.<cluster
    domain>``: a short name is completed by the pod's DNS search list, whose first hit may be
    a Service of that name in another namespace."""
    rank0 = pod_name(run.name, attempt, 0, run.spec.replicas)
    return f"{rank0}.{service_name(run.name)}.{run.namespace}.svc.{cluster_domain}"


DNS_LABEL_MAX = 63


def gang_name_problem(run_name: str, attempt: int, replicas: int) -> str | None:
    """Why a gang's pods cannot have DNS names under this run name, or None. A pod's hostname
    and the Service name are DNS labels (RFC 1035: a letter first, at most 63 characters)."""
    if replicas == 1:
        return None
    longest = pod_name(run_name, attempt, replicas - 1, replicas)
    if not run_name[:1].isalpha():
        return f"a run with replicas > 1 needs a name that starts with a letter, not {run_name!r}"
    if "." in run_name or len(longest) > DNS_LABEL_MAX:
        return (
            f"a run with replicas > 1 needs a name that is a DNS label: its pod {longest} must "
            f"have at most {DNS_LABEL_MAX} characters and no dots; rename the run"
        )
    return None


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
