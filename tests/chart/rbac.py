"""What the operator may and may not do through the API, as (API group, resource, verb): the
chart's RBAC is checked against these tables by the render tests (tests/chart) and against a real
API server by a SubjectAccessReview (tests/integration/test_chart.py).

The application entries are every call in ``trainingrun/operator/kube.py`` plus the kopf watches
that
``trainingrun/operator/handlers.py`` registers; the framework entries are what kopf needs to
discover
resources and keep its peering keep-alive.
"""

from __future__ import annotations

Grant = tuple[str, str, str]  # (api group, resource[/subresource], verb)

TRAININGRUN = "trainingrun.dev"
KOPF = "kopf.dev"
CRDS = "apiextensions.k8s.io"
KUEUE = "kueue.x-k8s.io"

# Namespaced rules: ClusterRole when cluster-wide, a Role per watched namespace otherwise.
APPLICATION_NAMESPACED: frozenset[Grant] = frozenset(
    {
        (TRAININGRUN, "trainingruns", "get"),  # Kube.get_run (a run the cache has not seen)
        (TRAININGRUN, "trainingruns", "list"),  # kopf watch of TrainingRuns
        (TRAININGRUN, "trainingruns", "watch"),
        (TRAININGRUN, "trainingruns/status", "patch"),  # Kube.patch_run_status
        ("", "pods", "get"),  # Kube.get_pod
        ("", "pods", "list"),  # kopf watch of run pods (also the pods on a node, from the cache)
        ("", "pods", "watch"),
        ("", "pods", "create"),  # Kube.create_pod
        ("", "pods", "delete"),  # Kube.delete_pod_by_uid
        ("", "pods", "patch"),  # Kube.annotate_pod (trainingrun.dev/ only: the chart's policy)
        ("", "services", "create"),  # Kube.create_service (a gang's headless Service)
        ("", "services", "get"),  # Kube.create_service, when it exists
        ("", "secrets", "get"),  # Kube.get_secret_data (credentialsSecret)
        ("", "events", "create"),  # Kube.event
        (KUEUE, "workloads", "get"),  # Kube.get_object (trainingrun.operator.queues)
        (KUEUE, "workloads", "create"),  # Kube.create_object (a queued run's Workload)
        (KUEUE, "workloads", "delete"),  # Kube.delete_object (a Workload of an older template)
        (KUEUE, "workloads/status", "update"),  # Kube.replace_object_status
    }
)
# Cluster-scoped resources: always a ClusterRole.
APPLICATION_CLUSTER: frozenset[Grant] = frozenset(
    {
        ("", "nodes", "get"),  # Kube.get_node
        ("", "nodes", "list"),  # kopf watch of nodes
        ("", "nodes", "watch"),
        (KUEUE, "workloadpriorityclasses", "get"),  # a queued run's priority (Kube.get_object)
    }
)
FRAMEWORK_ALWAYS: frozenset[Grant] = frozenset(
    {(CRDS, "customresourcedefinitions", "list"), (CRDS, "customresourcedefinitions", "watch")}
)
FRAMEWORK_CLUSTER_PEERING: frozenset[Grant] = frozenset(
    {(KOPF, "clusterkopfpeerings", v) for v in ("list", "watch", "patch")}
)
FRAMEWORK_NAMESPACED_PEERING: frozenset[Grant] = frozenset(
    {(KOPF, "kopfpeerings", v) for v in ("list", "watch", "patch")}
)
FRAMEWORK_NAMESPACES: frozenset[Grant] = frozenset(
    {("", "namespaces", "list"), ("", "namespaces", "watch")}
)

# Framework: leader election among the replicas, a Role in the release's namespace only (get and
# update limited to the release's Lease by name; create cannot be).
LEADER: frozenset[Grant] = frozenset(
    {("coordination.k8s.io", "leases", v) for v in ("create", "get", "update")}
)

# A few things the operator must never be able to do.
FORBIDDEN: tuple[Grant, ...] = (
    ("", "secrets", "list"),  # only the Secrets runs name, by name
    ("", "secrets", "watch"),
    ("", "secrets", "create"),
    ("", "pods/exec", "create"),
    ("", "pods/eviction", "create"),  # it deletes its own pods; it never evicts
    ("", "nodes", "patch"),
    ("", "nodes", "delete"),
    ("", "configmaps", "get"),
    (TRAININGRUN, "trainingruns", "delete"),
    (TRAININGRUN, "trainingruns", "update"),
    ("apps", "deployments", "create"),
    ("rbac.authorization.k8s.io", "clusterroles", "create"),
    (CRDS, "customresourcedefinitions", "create"),
)


def clusterwide_grants(peering: bool = True) -> frozenset[Grant]:
    """Everything a cluster-wide operator is granted."""
    grants = APPLICATION_NAMESPACED | APPLICATION_CLUSTER | FRAMEWORK_ALWAYS
    return grants | FRAMEWORK_CLUSTER_PEERING if peering else grants
