"""The chart without a cluster: ``helm lint``, and ``helm template`` renderings checked for

- the operator Deployment: two replicas electing a leader on a Lease (its Role limited to that
  Lease), rolled; one replica, Recreate, without leader election; the command line (peering,
  liveness, metrics, namespaces), kopf's liveness probe, secure defaults, and values flowing
  into env and args;
- RBAC: exactly the grants the operator needs (tests/chart/rbac.py), framework and application
  rules apart, never ``*``, cluster-wide and namespaced modes;
- the kopf peering object and its CRDs, the metrics Service, and the ServiceMonitor refused
  without it (the monitoring objects themselves: tests/chart/test_monitoring.py);
- generated files: the CRD copy and README.md are fresh, and every value is documented.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.chart import rbac, readme
from tests.chart.support import CHART, REPO, grants, helm_run, of_kind, only, template
from trainingrun.decide.pod import AgentSettings
from trainingrun.operator.settings import OperatorSettings

ROLE_KINDS = ("ClusterRole", "Role")


def container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    pod = only(objects, "Deployment")["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    return dict(c)


def env_of(c: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c["env"]}


# -- lint --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "values",
    [
        pytest.param({}, id="defaults"),
        pytest.param({"operator": {"watchNamespaces": ["a", "b"]}}, id="namespaced"),
        pytest.param({"peering": {"enabled": False}}, id="standalone"),
        pytest.param({"metrics": {"serviceMonitor": {"enabled": True}}}, id="servicemonitor"),
    ],
)
def test_helm_lint_strict_passes(helm: Path, values: dict[str, Any], tmp_path: Path) -> None:
    values_file = tmp_path / "values.json"
    values_file.write_text(json.dumps(values))
    proc = helm_run(helm, "lint", "--strict", str(CHART), "--values", str(values_file))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in proc.stdout


# -- the Deployment ------------------------------------------------------------------------------


def test_two_replicas_elect_a_leader_and_roll(helm: Path) -> None:
    objects = template(helm, release="ops", namespace="ops-ns")
    spec = only(objects, "Deployment")["spec"]
    assert (spec["replicas"], spec["strategy"]) == (2, {"type": "RollingUpdate"})
    assert "--leader-lease=ops-ns/ops-trainingrun" in container(objects)["args"]
    role = only(objects, "Role", "ops-trainingrun-leader")
    assert role["metadata"]["namespace"] == "ops-ns"
    assert grants(role) == rbac.LEADER
    named = [r for r in role["rules"] if set(r["verbs"]) & {"get", "update"}]
    assert [r["resourceNames"] for r in named] == [["ops-trainingrun"]]
    binding = only(objects, "RoleBinding", "ops-trainingrun-leader")
    assert binding["roleRef"]["name"] == "ops-trainingrun-leader"


def test_without_leader_election_one_operator_is_recreated_not_rolled(helm: Path) -> None:
    objects = template(helm, {"leaderElection": {"enabled": False}, "replicas": 1})
    spec = only(objects, "Deployment")["spec"]
    assert spec["replicas"] == 1
    assert spec["strategy"] == {"type": "Recreate"}
    assert not [a for a in container(objects)["args"] if a.startswith("--leader-lease")]
    assert not [r for r in of_kind(objects, "Role") if r["metadata"]["name"].endswith("-leader")]


def test_two_replicas_without_leader_election_are_refused(helm: Path) -> None:
    values = json.dumps({"leaderElection": {"enabled": False}, "replicas": 2})
    proc = helm_run(helm, "template", "tr", str(CHART), "--values", "-", stdin=values)
    assert proc.returncode != 0
    assert "replicas > 1 needs leaderElection.enabled" in proc.stderr


def test_command_line_by_default(helm: Path) -> None:
    c = container(template(helm, release="ops"))
    assert c["command"] == ["trainingrun"]
    assert c["args"] == [
        "operator",
        "--peering=ops-trainingrun",
        "--liveness=http://0.0.0.0:8080/healthz",
        "--leader-lease=trainingrun-system/ops-trainingrun",
        "--metrics-port=9090",
    ]
    assert c["image"] == "ghcr.io/trainingrun/operator:0.1.0"


def test_command_line_follows_values(helm: Path) -> None:
    values = {
        "peering": {"name": "shared"},
        "liveness": {"port": 8181},
        "metrics": {"port": 9191},
        "operator": {"watchNamespaces": ["team-a", "team-b"], "verbose": True},
    }
    c = container(template(helm, values))
    assert c["args"] == [
        "operator",
        "--peering=shared",
        "--liveness=http://0.0.0.0:8181/healthz",
        "--leader-lease=trainingrun-system/tr-trainingrun",
        "--metrics-port=9191",
        "--namespace=team-a",
        "--namespace=team-b",
        "--verbose",
    ]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"health": 8181, "metrics": 9191}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}


def test_standalone_without_peering(helm: Path) -> None:
    objects = template(helm, {"peering": {"enabled": False}})
    assert not any(a.startswith("--peering") for a in container(objects)["args"])
    assert not of_kind(objects, "ClusterKopfPeering", "KopfPeering")
    for role in of_kind(objects, *ROLE_KINDS):
        assert not {g for g in grants(role) if g[0] == rbac.KOPF}, role["metadata"]["name"]


def test_secure_defaults(helm: Path) -> None:
    objects = template(helm)
    pod = only(objects, "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert isinstance(pod["securityContext"]["runAsUser"], int)
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = container(objects)["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert "privileged" not in sc


def test_resources_and_probe_defaults(helm: Path) -> None:
    c = container(template(helm))
    assert c["resources"]["requests"] == {"cpu": "100m", "memory": "256Mi"}
    assert c["resources"]["limits"]["memory"] == "512Mi"
    probe = c["livenessProbe"]
    assert probe["timeoutSeconds"] >= 1
    assert probe["failureThreshold"] >= 1


def test_env_follows_values(helm: Path) -> None:
    values = {
        "agent": {"image": {"repository": "reg.example/agent", "tag": "7", "pullPolicy": "Always"}},
        "operator": {
            "resyncSeconds": 30,
            "resyncRate": 50,
            "checkpointRefreshSeconds": 45,
            "progressRefreshSeconds": 120,
            "noticeTaints": ["example.com/reclaim", "other/notice"],
            "workers": 3,
            "extraEnv": [{"name": "EXTRA", "value": "1"}],
        },
    }
    env = env_of(container(template(helm, values)))
    assert env["TRAININGRUN_AGENT_IMAGE"] == "reg.example/agent:7"
    assert env["TRAININGRUN_AGENT_PULL_POLICY"] == "Always"
    assert env["TRAININGRUN_RESYNC_SECONDS"] == "30"
    assert env["TRAININGRUN_RESYNC_RATE"] == "50"
    assert env["TRAININGRUN_CHECKPOINT_REFRESH_SECONDS"] == "45"
    assert env["TRAININGRUN_PROGRESS_REFRESH_SECONDS"] == "120"
    assert env["TRAININGRUN_NOTICE_TAINTS"] == "example.com/reclaim,other/notice"
    assert env["TRAININGRUN_WORKERS"] == "3"
    assert env["EXTRA"] == "1"
    assert env["POD_ID"] == {"fieldRef": {"fieldPath": "metadata.name"}}


def test_storage_allowlists_and_agent_settings_reach_the_operator(helm: Path) -> None:
    values = {
        "agent": {"metrics": "pod", "accessDeniedSeconds": 45},
        "storage": {
            "allowedEndpoints": ["http://minio.minio:9000", "aws"],
            "allowedUris": ["s3://ckpt/tenants/{namespace}"],
        },
    }
    env = env_of(container(template(helm, values)))

    settings = OperatorSettings.from_env({k: v for k, v in env.items() if isinstance(v, str)})
    assert settings.allowed_endpoints == ("http://minio.minio:9000", "aws")
    assert settings.allowed_uris == ("s3://ckpt/tenants/{namespace}",)
    assert settings.agent.metrics == "pod"
    assert settings.agent.access_denied_seconds == 45


def test_env_defaults_match_the_operator_defaults(helm: Path) -> None:
    """The chart's defaults are the operator's own (OperatorSettings, AgentSettings)."""
    env = env_of(container(template(helm)))
    assert env["TRAININGRUN_AGENT_IMAGE"] == AgentSettings.image
    assert env["TRAININGRUN_AGENT_PULL_POLICY"] == AgentSettings.image_pull_policy
    assert float(env["TRAININGRUN_RESYNC_SECONDS"]) == OperatorSettings.resync_seconds
    assert float(env["TRAININGRUN_RESYNC_RATE"]) == OperatorSettings.resync_rate
    assert (
        float(env["TRAININGRUN_CHECKPOINT_REFRESH_SECONDS"])
        == OperatorSettings.checkpoint_refresh_seconds
    )
    assert (
        float(env["TRAININGRUN_PROGRESS_REFRESH_SECONDS"])
        == OperatorSettings.progress_refresh_seconds
    )
    assert env["TRAININGRUN_NOTICE_TAINTS"] == ""
    defaults = OperatorSettings.from_env({k: v for k, v in env.items() if isinstance(v, str)})
    assert (defaults.allowed_endpoints, defaults.allowed_uris) == ((), ())
    assert defaults.agent.metrics == AgentSettings.metrics
    assert defaults.agent.access_denied_seconds == AgentSettings.access_denied_seconds


def test_digest_wins_over_tag(helm: Path) -> None:
    digest = "sha256:" + "ab" * 32
    values = {
        "image": {"tag": "9", "digest": digest},
        "agent": {"image": {"digest": digest}},
    }
    c = container(template(helm, values))
    assert c["image"] == f"ghcr.io/trainingrun/operator@{digest}"
    assert env_of(c)["TRAININGRUN_AGENT_IMAGE"] == f"ghcr.io/trainingrun/agent@{digest}"


def test_scheduling_values_reach_the_pod(helm: Path) -> None:
    values = {
        "nodeSelector": {"pool": "system"},
        "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
        "priorityClassName": "system-cluster-critical",
        "imagePullSecrets": [{"name": "regcred"}],
        "podLabels": {"team": "ml"},
    }
    pod = only(template(helm, values), "Deployment")["spec"]["template"]
    assert pod["spec"]["nodeSelector"] == {"pool": "system"}
    assert pod["spec"]["tolerations"][0]["key"] == "dedicated"
    assert pod["spec"]["priorityClassName"] == "system-cluster-critical"
    assert pod["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["metadata"]["labels"]["team"] == "ml"


def test_service_account_is_the_pods(helm: Path) -> None:
    objects = template(helm, release="ops")
    sa = only(objects, "ServiceAccount")["metadata"]["name"]
    pod = only(objects, "Deployment")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == sa == "ops-trainingrun"
    for binding in of_kind(objects, "ClusterRoleBinding", "RoleBinding"):
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": sa, "namespace": "trainingrun-system"}
        ]


# -- RBAC ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "values",
    [
        pytest.param({}, id="clusterwide"),
        pytest.param({"operator": {"watchNamespaces": ["a", "b"]}}, id="namespaced"),
    ],
)
def test_rbac_has_no_wildcards(helm: Path, values: dict[str, Any]) -> None:
    roles = of_kind(template(helm, values), *ROLE_KINDS)
    assert roles
    for role in roles:
        for rule in role["rules"]:
            for field in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule.get(field, []), (role["metadata"]["name"], rule)
            assert "nonResourceURLs" not in rule
            assert "resourceNames" not in rule or rule["resourceNames"]


def test_clusterwide_rbac_is_exactly_what_the_operator_uses(helm: Path) -> None:
    roles = of_kind(template(helm, release="ops"), *ROLE_KINDS)
    # ClusterRoles, and the Lease of the leader election in the release's namespace.
    assert [r["metadata"]["name"] for r in roles if r["kind"] == "Role"] == [
        "ops-trainingrun-leader"
    ]
    roles = [r for r in roles if r["kind"] == "ClusterRole"]
    granted = set().union(*(grants(r) for r in roles))
    assert granted == rbac.clusterwide_grants()
    assert not granted & set(rbac.FORBIDDEN)


def test_framework_and_application_rules_are_apart(helm: Path) -> None:
    objects = template(helm, release="ops")
    framework = grants(only(objects, "ClusterRole", "ops-trainingrun-framework"))
    application = grants(only(objects, "ClusterRole", "ops-trainingrun"))
    assert framework == rbac.FRAMEWORK_ALWAYS | rbac.FRAMEWORK_CLUSTER_PEERING
    assert application == rbac.APPLICATION_NAMESPACED | rbac.APPLICATION_CLUSTER
    for name in ("ops-trainingrun-framework", "ops-trainingrun"):
        binding = only(objects, "ClusterRoleBinding", name)
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": name,
        }


def test_every_rule_says_why() -> None:
    """Each rule in the RBAC template has a comment right above it."""
    lines = (CHART / "templates" / "rbac.yaml").read_text().splitlines()
    starts = [i for i, line in enumerate(lines) if line.strip().startswith("- apiGroups:")]
    assert len(starts) >= 8
    prefixes = ("# Framework:", "# Application:")
    for i in starts:
        j = i - 1
        while (
            j > 0 and lines[j].strip().startswith("#") and not lines[j].strip().startswith(prefixes)
        ):
            j -= 1  # up through the comment's continuation lines
        assert lines[j].strip().startswith(prefixes), (
            f"rbac.yaml line {i + 1}: a rule without a '# Framework:' or '# Application:' comment"
        )


def test_namespaced_rbac_uses_roles_in_each_namespace(helm: Path) -> None:
    objects = template(helm, {"operator": {"watchNamespaces": ["a", "b"]}}, release="ops")
    for ns in ("a", "b"):
        app = [r for r in of_kind(objects, "Role") if r["metadata"]["namespace"] == ns]
        assert {r["metadata"]["name"] for r in app} == {
            "ops-trainingrun",
            "ops-trainingrun-framework",
        }
        assert grants(only(app, "Role", "ops-trainingrun")) == rbac.APPLICATION_NAMESPACED
        assert grants(only(app, "Role", "ops-trainingrun-framework")) == (
            rbac.FRAMEWORK_NAMESPACED_PEERING
        )
        bindings = [b for b in of_kind(objects, "RoleBinding") if b["metadata"]["namespace"] == ns]
        assert len(bindings) == 2
    cluster = set().union(*(grants(r) for r in of_kind(objects, "ClusterRole")))
    # Cluster-wide only what is cluster-scoped: the pods on a node come from the pod cache.
    assert cluster == rbac.FRAMEWORK_ALWAYS | rbac.FRAMEWORK_NAMESPACES | rbac.APPLICATION_CLUSTER


def test_no_rbac_when_disabled(helm: Path) -> None:
    objects = template(helm, {"rbac": {"create": False}})
    assert not of_kind(objects, "ClusterRole", "Role", "ClusterRoleBinding", "RoleBinding")


# -- peering, metrics ----------------------------------------------------------------------------


def test_peering_object_matches_the_peering_flag(helm: Path) -> None:
    objects = template(helm, release="ops")
    peering = only(objects, "ClusterKopfPeering")
    assert peering["apiVersion"] == "kopf.dev/v1"
    assert f"--peering={peering['metadata']['name']}" in container(objects)["args"]


def test_namespaced_peering_objects(helm: Path) -> None:
    objects = template(helm, {"operator": {"watchNamespaces": ["a", "b"]}}, release="ops")
    assert not of_kind(objects, "ClusterKopfPeering")
    peerings = of_kind(objects, "KopfPeering")
    assert {(p["metadata"]["namespace"], p["metadata"]["name"]) for p in peerings} == {
        ("a", "ops-trainingrun"),
        ("b", "ops-trainingrun"),
    }


def test_metrics_service_selects_the_operator_pod(helm: Path) -> None:
    objects = template(helm, {"metrics": {"port": 9191}})
    service = only(objects, "Service")
    pod_labels = only(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": 9191, "targetPort": "metrics", "protocol": "TCP"}
    ]


def test_service_monitor_without_the_service_is_refused(helm: Path) -> None:
    values = {"metrics": {"service": {"enabled": False}, "serviceMonitor": {"enabled": True}}}
    with pytest.raises(AssertionError, match=r"needs metrics\.service\.enabled"):
        template(helm, values)


# -- CRDs and generated files --------------------------------------------------------------------


def test_crd_copy_is_fresh() -> None:
    copy = CHART / "crds" / "trainingrun.yaml"
    assert copy.read_text() == (REPO / "crds" / "trainingrun.yaml").read_text(), (
        f"{copy} is stale: run 'make chart-crds'"
    )


def test_chart_ships_the_trainingrun_and_kopf_peering_crds(helm: Path) -> None:
    crds = of_kind(template(helm, include_crds=True), "CustomResourceDefinition")
    names = {c["metadata"]["name"] for c in crds}
    assert names == {
        "trainingruns.trainingrun.dev",
        "clusterkopfpeerings.kopf.dev",
        "kopfpeerings.kopf.dev",
    }
    for crd in crds:
        if crd["spec"]["group"] == rbac.KOPF:
            # kopf merge-patches the object itself: a status subresource would need other RBAC.
            assert all("subresources" not in v for v in crd["spec"]["versions"])


def test_readme_is_fresh() -> None:
    assert (CHART / "README.md").read_text() == readme.render(), (
        "charts/trainingrun/README.md is stale: run 'make chart-readme'"
    )


def test_every_value_is_documented() -> None:
    text = (CHART / "values.yaml").read_text()
    assert readme.undocumented(text) == []
    keys = {v.key for v in readme.documented(text)}
    assert {"image.repository", "agent.image.tag", "operator.noticeTaints", "resources"} <= keys


def test_undocumented_value_is_named() -> None:
    text = "# -- documented\na: 1\nb:\n  # -- documented too\n  c: 2\n  d: 3\n"
    assert readme.undocumented(text) == ["b.d"]
    assert [v.key for v in readme.documented(text)] == ["a", "b.c"]
