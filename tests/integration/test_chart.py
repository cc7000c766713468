"""The Helm chart against the real control plane (no mocks): ``helm install`` into a fresh
namespace with a release name of its own, the operator pod scheduled on a kwok node, and RBAC
checked by the API server itself.

Covers: a cluster-wide install next to the TrainingRun CRD that other tests installed already
(helm skips an existing CRD), the pod Running on the kwok node with the chart's security context,
the CRDs served and the peering object created; a SubjectAccessReview allowing every verb and
resource the operator uses (tests/chart/rbac.py) and no for a few it must not have; uninstall
removes the RBAC and keeps the CRDs. A namespaced install, and the real operator process
authenticated as the chart's ServiceAccount (a TokenRequest token, no impersonation) taking a
TrainingRun through start, a preemption notice and a resubmission with no 403 in its log (under
the chart's admission policy on pod patches), with no pods list outside its namespace. That
policy (``rbac.restrictPodPatches``) as the ServiceAccount: adding a trainingrun.dev/ annotation
is allowed; changing a label, another annotation or the spec is denied with its message; an
administrator's change of a label is not the policy's business.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from tests.chart import rbac
from tests.integration.support import Runs, credentials_secret, trainingrun, wait_for
from tests.localenv import LocalEnv
from trainingrun import api
from trainingrun.contract import ANNOTATION_NOTICE

CHART = Path(__file__).resolve().parents[2] / "charts" / "trainingrun"


class Release:
    """One helm release of the chart in one namespace of the local environment."""

    def __init__(self, helm: Path, env: LocalEnv, namespace: str, api_client: Any) -> None:
        self.helm, self.env, self.namespace = helm, env, namespace
        self.authorization = client.AuthorizationV1Api(api_client)
        self.name = f"chart-{uuid.uuid4().hex[:6]}"
        self.fullname = f"{self.name}-trainingrun"
        self.installed = False

    def run(self, *args: str, stdin: str | None = None) -> str:
        proc = subprocess.run(
            [str(self.helm), *args, "--kubeconfig", self.env.kubeconfig, "-n", self.namespace],
            input=stdin,
            capture_output=True,
            text=True,
            check=False,
            timeout=300,
        )
        assert proc.returncode == 0, f"helm {args[0]} failed: {proc.stderr}"
        return proc.stdout

    def install(self, values: dict[str, Any]) -> None:
        self.run(
            "install",
            self.name,
            str(CHART),
            "--values",
            "-",
            "--wait",
            "--timeout",
            "180s",
            stdin=json.dumps(values),
        )
        self.installed = True

    def uninstall(self) -> None:
        if self.installed:
            self.run("uninstall", self.name, "--wait", "--timeout", "120s")
            self.installed = False

    def can_i(
        self, group: str, resource: str, verb: str, namespace: str | None, named: str = ""
    ) -> bool:
        """The API server's answer for the chart's ServiceAccount: a SubjectAccessReview that
        names the group and resource itself, so a resource whose CRD is not installed (Kueue's)
        is asked about as it is (``kubectl auth can-i`` cannot resolve it and asks about a
        resource of that whole dotted name in the core group instead)."""
        name, _, sub = resource.partition("/")
        account = f"system:serviceaccount:{self.namespace}:{self.fullname}"
        groups = ["system:serviceaccounts", f"system:serviceaccounts:{self.namespace}"]
        review = client.V1SubjectAccessReview(
            spec=client.V1SubjectAccessReviewSpec(
                user=account,
                groups=[*groups, "system:authenticated"],
                resource_attributes=client.V1ResourceAttributes(
                    group=group,
                    resource=name,
                    subresource=sub or None,
                    verb=verb,
                    namespace=namespace or "",
                    name=named or None,
                ),
            )
        )
        answer = self.authorization.create_subject_access_review(review)
        return bool(answer.status.allowed)


@pytest.fixture
def release(helm: Path, localenv: LocalEnv, namespace: str, api_client: Any) -> Iterator[Release]:
    rel = Release(helm, localenv, namespace, api_client)
    yield rel
    rel.uninstall()


def operator_pods(core_v1: Any, release: Release) -> list[Any]:
    """The release's operator pods: two replicas (one leads, tests/integration/test_failover.py)."""
    pods = core_v1.list_namespaced_pod(
        release.namespace, label_selector=f"app.kubernetes.io/instance={release.name}"
    ).items
    assert len(pods) == 2, [p.metadata.name for p in pods]
    return list(pods)


def test_clusterwide_install_grants_what_the_operator_uses(
    release: Release,
    localenv: LocalEnv,
    crd: str,
    kwok_node: Callable[..., str],
    core_v1: Any,
    api_client: Any,
) -> None:
    node = kwok_node()
    # The TrainingRun CRD exists already (the crd fixture): helm installs the chart anyway.
    release.install({"nodeSelector": {"kubernetes.io/hostname": node}})

    for pod in operator_pods(core_v1, release):
        assert pod.spec.node_name == node
        assert pod.status.phase == "Running"
        assert pod.spec.service_account_name == release.fullname
        assert pod.spec.security_context.run_as_non_root is True
        assert pod.spec.containers[0].security_context.read_only_root_filesystem is True
        assert pod.spec.containers[0].args[:2] == ["operator", f"--peering={release.fullname}"]
        lease = f"--leader-lease={release.namespace}/{release.fullname}"
        assert lease in pod.spec.containers[0].args

    custom = client.CustomObjectsApi(api_client)
    custom.list_namespaced_custom_object(api.GROUP, api.VERSION, release.namespace, api.PLURAL)
    peering = custom.get_cluster_custom_object(
        "kopf.dev", "v1", "clusterkopfpeerings", release.fullname
    )
    assert peering["metadata"]["name"] == release.fullname

    other = "default"
    for group, resource, verb in sorted(rbac.clusterwide_grants()):
        for ns in (None, release.namespace, other):
            if resource in ("nodes", "customresourcedefinitions", "clusterkopfpeerings") and ns:
                continue  # cluster-scoped
            assert release.can_i(group, resource, verb, ns), (verb, group, resource, ns)
    for group, resource, verb in rbac.FORBIDDEN:
        assert not release.can_i(group, resource, verb, release.namespace), (verb, resource)
        assert not release.can_i(group, resource, verb, None), (verb, resource)
    for group, resource, verb in rbac.LEADER:  # the Lease: in the release's namespace only
        assert release.can_i(group, resource, verb, release.namespace, release.fullname)
        assert not release.can_i(group, resource, verb, other, release.fullname)
    assert not release.can_i("coordination.k8s.io", "leases", "update", release.namespace, "x")

    release.uninstall()
    rbac_v1 = client.RbacAuthorizationV1Api(api_client)
    names = {r.metadata.name for r in rbac_v1.list_cluster_role().items}
    assert not {release.fullname, f"{release.fullname}-framework"} & names
    assert not release.can_i("", "pods", "create", release.namespace)
    # helm never deletes CRDs: the TrainingRuns of other releases and tests stay.
    custom.list_namespaced_custom_object(api.GROUP, api.VERSION, release.namespace, api.PLURAL)


def _sa_kubeconfig(env: LocalEnv, core_v1: Any, release: Release, path: Path) -> Path:
    """A kubeconfig that authenticates as the chart's ServiceAccount with a short-lived token."""
    token = core_v1.create_namespaced_service_account_token(
        release.fullname,
        release.namespace,
        client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600)
        ),
    ).status.token
    admin = yaml.safe_load(Path(env.kubeconfig).read_text())
    context = next(c for c in admin["contexts"] if c["name"] == admin["current-context"])
    cluster = next(c for c in admin["clusters"] if c["name"] == context["context"]["cluster"])
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [cluster],
        "users": [{"name": "operator", "user": {"token": token}}],
        "contexts": [
            {"name": "operator", "context": {"cluster": cluster["name"], "user": "operator"}}
        ],
        "current-context": "operator",
    }
    path.touch(mode=0o600)
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.usefixtures("session_operator_paused")
def test_operator_runs_as_the_charts_service_account(
    release: Release,
    localenv: LocalEnv,
    crd: str,
    kwok_node: Callable[..., str],
    core_v1: Any,
    api_client: Any,
    tmp_path: Path,
) -> None:
    ns = release.namespace
    node = kwok_node()
    release.install(
        {
            "operator": {"watchNamespaces": [ns]},
            "nodeSelector": {"kubernetes.io/hostname": node},
        }
    )
    assert {p.status.phase for p in operator_pods(core_v1, release)} == {"Running"}
    # Namespaced: the namespaced rules hold in the watched namespace only.
    assert release.can_i("", "pods", "create", ns)
    assert release.can_i(api.GROUP, "trainingruns/status", "patch", ns)
    assert release.can_i("kopf.dev", "kopfpeerings", "patch", ns)
    assert not release.can_i("", "pods", "create", "default")
    assert not release.can_i("", "secrets", "get", "default")
    assert not release.can_i("kopf.dev", "clusterkopfpeerings", "patch", None)
    # The pods on a node come from the operator's pod cache: no list of pods elsewhere.
    assert not release.can_i("", "pods", "list", "default")
    assert not release.can_i("", "pods", "list", None)

    kubeconfig = _sa_kubeconfig(localenv, core_v1, release, tmp_path / "operator.kubeconfig")
    identity = f"chart-test-{uuid.uuid4().hex[:6]}"
    log_path = tmp_path / "operator.log"
    env = {
        **os.environ,
        "KUBECONFIG": str(kubeconfig),
        "POD_ID": identity,
        "TRAININGRUN_RESYNC_SECONDS": "600",
        "TRAININGRUN_CHECKPOINT_REFRESH_SECONDS": "1",
    }
    args = ["operator", f"--namespace={ns}", f"--peering={release.fullname}"]
    args.append(f"--leader-lease={release.namespace}/{release.fullname}")  # the chart's Lease
    with log_path.open("ab") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "trainingrun.cli", *args],
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    try:
        custom = client.CustomObjectsApi(api_client)

        def keepalive() -> bool:
            peering = custom.get_namespaced_custom_object(
                "kopf.dev", "v1", ns, "kopfpeerings", release.fullname
            )
            return identity in (peering.get("status") or {})

        wait_for(keepalive, 30, "the operator's keep-alive in its KopfPeering")

        core_v1.create_namespaced_secret(ns, credentials_secret(localenv))
        runs = Runs(api_client, ns)
        prefix = f"chart-{uuid.uuid4().hex[:8]}"
        runs.create(trainingrun("r", localenv, prefix, node=node))
        runs.wait_status("r", lambda s: s.get("activePod") == "r-1", 30, "attempt 1 started")
        runs.wait_pod_running("r-1")

        # A notice taint: the operator watches nodes, lists the pods on that node and
        # annotates them (pods patch).
        core_v1.patch_node(
            node,
            {"spec": {"taints": [{"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}]}},
        )
        wait_for(
            lambda: ANNOTATION_NOTICE in (runs.pod("r-1").metadata.annotations or {}),
            30,
            "the notice annotation on r-1",
        )
        core_v1.patch_node(node, {"spec": {"taints": []}})
        runs.end_pod("r-1", 1)
        status = runs.wait_status(
            "r", lambda s: s.get("activePod") == "r-2", 30, "attempt 2 after the notice"
        )
        assert status["preemptions"] == 1
        assert runs.wait_events("r", "Preempted")
        assert proc.poll() is None, "the operator exited"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    log = log_path.read_text(errors="replace")
    for sign in ("403", "Forbidden", "forbidden", "Not enough permissions"):
        assert sign not in log, f"RBAC refused the operator something:\n{log[-3000:]}"


POLICY_MESSAGE = (
    "the trainingrun operator may change a pod only in its trainingrun.dev/ annotations"
)


def _plain_pod(name: str) -> dict[str, Any]:
    """A pod the operator's Role covers; never scheduled (no kwok node matches it)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {"team": "a"},
            "annotations": {"example.com/owner": "alice"},
        },
        "spec": {
            "nodeSelector": {"trainingrun.dev/no-such-node": "x"},
            "containers": [{"name": "main", "image": "registry.invalid/none:1"}],
        },
    }


def _refusal(patch: Callable[[], Any]) -> str | None:
    """The API server's message when it refuses the patch with 403, None when it accepts it."""
    try:
        patch()
    except ApiException as e:
        assert e.status == 403, (e.status, e.body)
        return str(json.loads(e.body)["message"])
    return None


def test_pod_patch_policy_lets_the_operator_add_only_its_annotations(
    release: Release,
    localenv: LocalEnv,
    crd: str,
    kwok_node: Callable[..., str],
    core_v1: Any,
    tmp_path: Path,
) -> None:
    ns = release.namespace
    node = kwok_node()
    release.install(
        {
            "operator": {"watchNamespaces": [ns]},
            "nodeSelector": {"kubernetes.io/hostname": node},
            "replicas": 1,
            "leaderElection": {"enabled": False},
        }
    )
    core_v1.create_namespaced_pod(ns, _plain_pod("p"))
    kubeconfig = _sa_kubeconfig(localenv, core_v1, release, tmp_path / "operator.kubeconfig")
    as_operator = client.CoreV1Api(config.new_client_from_config(config_file=str(kubeconfig)))

    def patch(metadata: dict[str, Any] | None = None, **spec: Any) -> Callable[[], Any]:
        body = {"metadata": metadata or {}, **({"spec": spec} if spec else {})}
        return lambda: as_operator.patch_namespaced_pod("p", ns, body)

    # The policy takes effect once the API server has loaded it: a fresh label value each try.
    denied = wait_for(
        lambda: _refusal(patch({"labels": {"team": uuid.uuid4().hex[:8]}})),
        30,
        "the policy to deny the operator a label change",
    )
    assert POLICY_MESSAGE in denied and "changes its labels" in denied
    assert release.fullname + "-pod-patches" in denied

    assert _refusal(patch({"annotations": {ANNOTATION_NOTICE: "karpenter.sh/disrupted"}})) is None
    assert _refusal(patch({"annotations": {"trainingrun.dev/other": "x"}})) is None
    changes: list[tuple[dict[str, Any], str]] = [
        ({"annotations": {"example.com/owner": "mallory"}}, "another annotation"),
        ({"annotations": {"example.com/new": "x"}}, "another annotation"),
        ({"annotations": {"example.com/owner": None}}, "another annotation"),
        ({"finalizers": ["example.com/keep"]}, "finalizers or owner references"),
    ]
    for change, what in changes:
        refused = _refusal(patch(change))
        assert refused is not None and POLICY_MESSAGE in refused, change
        assert f"changes {what}" in refused or f"changes its {what}" in refused, refused
    refused = _refusal(patch(activeDeadlineSeconds=60))
    assert refused is not None and "changes its spec" in refused

    pod = core_v1.read_namespaced_pod("p", ns)
    assert pod.metadata.annotations == {
        "example.com/owner": "alice",
        ANNOTATION_NOTICE: "karpenter.sh/disrupted",
        "trainingrun.dev/other": "x",
    }
    assert pod.metadata.finalizers is None and pod.spec.active_deadline_seconds is None
    # Only the operator's requests are the policy's business.
    core_v1.patch_namespaced_pod("p", ns, {"metadata": {"labels": {"team": "b"}}})
    assert core_v1.read_namespaced_pod("p", ns).metadata.labels == {"team": "b"}
