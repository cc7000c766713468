"""The chart's monitoring, checked against the metrics the operator and the agents really export.

Covers:

- the ServiceMonitor, PodMonitor, PrometheusRule and dashboard ConfigMap are off by default; the
  three Prometheus Operator objects appear only when the cluster serves monitoring.coreos.com/v1;
  the ServiceMonitor keeps the runs' namespace label (honorLabels); the PodMonitor keeps only
  the sync sidecars, on the pod IP and port, labelled by run and attempt, and is refused without
  ``agent.metrics: pod``; the dashboard ConfigMap carries the file and Grafana's sidecar label;
  the per-run metrics settings reach the operator's environment;
- every PromQL of the rules and of the dashboard (panels and variables) names only series that
  the real metric classes expose (``tests.chart.monitoring.exported_names``) or that a rule of the
  chart records; a metric renamed in the code, or in a copy of a rule, is caught;
- the reader of metric names in PromQL, on expressions of every shape it meets;
- ``promtool check rules`` passes on the rendered rules and on the dashboard's queries (as
  recording rules), and fails on a broken one; ``promtool check metrics`` passes on the real
  exposition; ``promtool test rules`` shows each alert firing when it should and not otherwise.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart import monitoring as m
from tests.chart.support import of_kind, only
from tests.localenv import hack_output
from trainingrun import contract
from trainingrun.operator.settings import OperatorSettings

PROMETHEUS_OPERATOR_KINDS = ("ServiceMonitor", "PodMonitor", "PrometheusRule")


@pytest.fixture(scope="session")
def promtool() -> Path:
    """promtool, built from Prometheus' Go module by hack/build-promtool.sh (cached)."""
    path = hack_output("build-promtool.sh")
    assert path.exists(), f"{path} is missing: hack/build-promtool.sh should have built it"
    return path


@pytest.fixture(scope="module")
def monitored(helm: Path) -> list[dict[str, Any]]:
    """The chart with every monitoring object on, in a cluster that serves their API."""
    return m.render(helm, m.MONITORING_ON)


@pytest.fixture(scope="module")
def queries(monitored: list[dict[str, Any]]) -> dict[str, str]:
    """Every PromQL of the chart, by where it is."""
    found = {
        f"rule {r.get('alert') or r.get('record')}": r["expr"]
        for r in m.rules(m.rule_groups(monitored))
    }
    dashboard = m.dashboard_queries(m.dashboard_of(monitored))
    found.update({where: m.as_promql(expr) for where, expr in dashboard.items()})
    return found


@pytest.fixture(scope="module")
def known_names(monitored: list[dict[str, Any]]) -> set[str]:
    """What PromQL of the chart may name: the real exposition's series and the chart's own
    recorded series."""
    recorded = {r["record"] for r in m.rules(m.rule_groups(monitored)) if "record" in r}
    return m.exported_names() | recorded


def unknown_names(queries: dict[str, str], known: set[str]) -> dict[str, set[str]]:
    """The names each query selects that nothing exports, by where the query is."""
    found = {where: m.metric_names(expr) - known for where, expr in queries.items()}
    return {where: names for where, names in found.items() if names}


# -- the objects -------------------------------------------------------------------------------


def test_monitoring_is_off_by_default(helm: Path) -> None:
    objects = m.render(helm)

    assert not of_kind(objects, *PROMETHEUS_OPERATOR_KINDS)
    assert not [o for o in of_kind(objects, "ConfigMap") if "dashboard" in o["metadata"]["name"]]


def test_prometheus_operator_objects_need_its_api_the_dashboard_does_not(helm: Path) -> None:
    with_api = m.render(helm, m.MONITORING_ON)
    without = m.render(helm, m.MONITORING_ON, api_versions=())

    assert sorted(o["kind"] for o in of_kind(with_api, *PROMETHEUS_OPERATOR_KINDS)) == sorted(
        PROMETHEUS_OPERATOR_KINDS
    )
    assert not of_kind(without, *PROMETHEUS_OPERATOR_KINDS)
    assert only(without, "ConfigMap", "tr-trainingrun-dashboard")


def test_service_monitor_scrapes_the_metrics_service_keeping_the_runs_namespace(
    helm: Path,
) -> None:
    values = {
        "metrics": {
            "serviceMonitor": {"enabled": True, "interval": "15s", "labels": {"release": "prom"}}
        }
    }
    objects = m.render(helm, values)
    monitor = only(objects, "ServiceMonitor")

    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["endpoints"] == [
        {"port": "metrics", "path": "/metrics", "honorLabels": True, "interval": "15s"}
    ]
    service_labels = only(objects, "Service")["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service_labels.items()


def relabel(monitor: dict[str, Any], action: str, source: str) -> dict[str, Any]:
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    (found,) = [
        r
        for r in endpoint["relabelings"]
        if r.get("action", "replace") == action and r["sourceLabels"] == [source]
    ]
    return dict(found)


def test_pod_monitor_scrapes_each_sync_sidecar_on_its_pod_ip(helm: Path) -> None:
    values = {**m.MONITORING_ON, "operator": {"watchNamespaces": ["a", "b"]}}
    values["metrics"] = {**values["metrics"], "podMonitor": {"enabled": True, "port": 9300}}
    monitor = only(m.render(helm, values), "PodMonitor")

    assert monitor["spec"]["selector"] == {
        "matchExpressions": [{"key": contract.LABEL_RUN, "operator": "Exists"}]
    }
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["a", "b"]}
    keep = relabel(monitor, "keep", "__meta_kubernetes_pod_container_name")
    assert keep["regex"] == contract.SYNC_CONTAINER
    address = relabel(monitor, "replace", "__meta_kubernetes_pod_ip")
    assert (address["targetLabel"], address["replacement"]) == ("__address__", "${1}:9300")
    run = relabel(monitor, "replace", "__meta_kubernetes_pod_label_trainingrun_dev_run")
    assert run["targetLabel"] == "run"


def test_pod_monitor_watches_every_namespace_when_the_operator_does(helm: Path) -> None:
    monitor = only(m.render(helm, m.MONITORING_ON), "PodMonitor")

    assert monitor["spec"]["namespaceSelector"] == {"any": True}


def test_pod_monitor_without_agents_on_the_pod_ip_is_refused(helm: Path) -> None:
    values = {"metrics": {"podMonitor": {"enabled": True}}}  # agent.metrics: loopback

    with pytest.raises(AssertionError, match=r"needs agent\.metrics: pod"):
        m.render(helm, values)


def test_dashboard_config_map_is_labelled_for_grafanas_sidecar(helm: Path) -> None:
    default = only(m.render(helm, m.MONITORING_ON), "ConfigMap", "tr-trainingrun-dashboard")
    assert default["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert default["metadata"]["namespace"] == "trainingrun-system"
    assert json.loads(default["data"]["trainingrun.json"]) == json.loads(m.DASHBOARD.read_text())

    values = {
        "metrics": {
            "dashboard": {
                "enabled": True,
                "label": "my_dashboards",
                "labelValue": "yes",
                "labels": {"team": "ml"},
                "annotations": {"grafana_folder": "Training"},
                "namespace": "grafana",
            }
        }
    }
    custom = only(m.render(helm, values), "ConfigMap", "tr-trainingrun-dashboard")
    assert custom["metadata"]["labels"]["my_dashboards"] == "yes"
    assert custom["metadata"]["labels"]["team"] == "ml"
    assert "grafana_dashboard" not in custom["metadata"]["labels"]
    assert custom["metadata"]["annotations"] == {"grafana_folder": "Training"}
    assert custom["metadata"]["namespace"] == "grafana"


@pytest.mark.parametrize(
    ("values", "enabled", "keep"),
    [
        pytest.param({}, True, 3600, id="defaults"),
        pytest.param({"enabled": False}, False, 3600, id="off"),
        pytest.param({"keepFinishedSeconds": 0}, True, 0, id="only-unfinished"),
    ],
)
def test_per_run_metrics_settings_reach_the_operator(
    helm: Path, values: dict[str, Any], enabled: bool, keep: float
) -> None:
    objects = m.render(helm, {"metrics": {"runs": values}})
    (operator,) = only(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in operator["env"] if "value" in e}

    settings = OperatorSettings.from_env(env)
    assert (settings.run_metrics, settings.run_metrics_keep_finished_seconds) == (enabled, keep)


def test_every_rule_has_its_documented_alerts(monitored: list[dict[str, Any]]) -> None:
    names = {r.get("alert") or r["record"] for r in m.rules(m.rule_groups(monitored))}

    assert names == {
        "namespace_run:trainingrun_commit_interval_seconds",
        "TrainingRunNoCommit",
        "TrainingRunNearRestartBudget",
        "TrainingRunLowGoodput",
        "TrainingRunOperatorNotLeading",
    }


# -- every name in the rules and the dashboard is exported ---------------------------------------


def test_every_query_names_only_exported_metrics(
    queries: dict[str, str], known_names: set[str]
) -> None:
    assert len(queries) >= 30, sorted(queries)  # the rules, every panel target, the variables
    assert all(m.metric_names(expr) for expr in queries.values())  # each selects something
    assert unknown_names(queries, known_names) == {}


def test_exported_names_come_from_the_real_classes() -> None:
    names = m.exported_names()

    # One of each source: OperatorMetrics, the per-run collector, the leader flag, the sync
    # sidecar, the restore, and the client's process collector.
    for name in (
        "trainingrun_transitions_total",
        "trainingrun_run_restarts_total",
        "trainingrun_operator_leader",
        "trainingrun_sync_pending_checkpoints",
        "trainingrun_restore_failures_total",
        "process_resident_memory_bytes",
    ):
        assert name in names
    assert "trainingrun_run_restarts" not in names  # a counter's series end in _total


def used_names(queries: dict[str, str]) -> list[str]:
    return sorted(set().union(*(m.metric_names(e) for e in queries.values())))


def test_a_metric_renamed_in_the_code_is_caught(
    queries: dict[str, str], known_names: set[str]
) -> None:
    """For every name the chart uses: take it out of what is exported (as a rename in the code
    would) and the check names the queries that use it."""
    for name in used_names(queries):
        renamed = (known_names - {name}) | {name + "_renamed"}
        caught = unknown_names(queries, renamed)
        assert caught, f"renaming {name} went unnoticed"
        assert all(names == {name} for names in caught.values()), caught


@pytest.mark.parametrize(
    ("old", "new"),
    [
        pytest.param("trainingrun_run_restarts_total", "trainingrun_run_restarts", id="restarts"),
        pytest.param(
            "trainingrun_run_last_commit_timestamp_seconds",
            "trainingrun_run_last_commit_time",
            id="last-commit",
        ),
        pytest.param("trainingrun_operator_leader", "trainingrun_leader", id="leader"),
    ],
)
def test_a_metric_renamed_in_a_copy_of_the_rules_is_caught(
    monitored: list[dict[str, Any]], known_names: set[str], old: str, new: str
) -> None:
    text = yaml.safe_dump(m.rule_groups(monitored))
    assert old in text
    planted = yaml.safe_load(text.replace(old, new))
    exprs = {f"rule {r.get('alert') or r.get('record')}": r["expr"] for r in m.rules(planted)}

    caught = unknown_names(exprs, known_names)
    assert caught
    assert set().union(*caught.values()) == {new}


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        pytest.param("up", {"up"}, id="bare"),
        pytest.param('a_total{job="x", le=~"1|2"}', {"a_total"}, id="matchers"),
        pytest.param("sum by (kind, run) (rate(a_total[5m]))", {"a_total"}, id="sum-by-first"),
        pytest.param("sum(rate(a_total[5m:1m])) by (le)", {"a_total"}, id="by-after-subquery"),
        pytest.param(
            "a > on (namespace, run) group_left (phase) b", {"a", "b"}, id="matching-labels"
        ),
        pytest.param("max(a) or vector(0)", {"a"}, id="function-and-set-operator"),
        pytest.param("time() - max(ns:b:rate offset 1m)", {"ns:b:rate"}, id="recorded-offset"),
        pytest.param("a > bool 0.5e-3 unless c", {"a", "c"}, id="bool-number"),
        pytest.param(
            'label_replace(a, "dst", "$1", "src", "(.*)") # a comment b', {"a"}, id="strings"
        ),
        pytest.param("histogram_quantile(0.99, sum by (le) (rate(h_bucket[5m])))", {"h_bucket"}),
        pytest.param("topk(5, a) @ end()", {"a"}, id="at-modifier"),
        pytest.param("count_values without (x) ('v', a)", {"a"}, id="without"),
    ],
)
def test_metric_names_reads_promql(expr: str, names: set[str]) -> None:
    assert m.metric_names(expr) == names


def test_metric_names_refuses_what_it_cannot_read() -> None:
    with pytest.raises(ValueError, match="cannot read PromQL"):
        m.metric_names("rate(a[$__rate_interval])")  # a Grafana range left unfilled


# -- promtool ----------------------------------------------------------------------------------


def test_promtool_check_rules_passes_on_the_rendered_rules(
    promtool: Path, monitored: list[dict[str, Any]], tmp_path: Path
) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": m.rule_groups(monitored)}))

    proc = m.run_promtool(promtool, "check", "rules", str(rules))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS: 5 rules found" in proc.stdout


def test_promtool_check_rules_passes_on_the_dashboards_queries(
    promtool: Path, monitored: list[dict[str, Any]], tmp_path: Path
) -> None:
    """Each dashboard query as a recording rule: Prometheus' own parser reads every one."""
    dashboard = m.dashboard_queries(m.dashboard_of(monitored))
    recorded = [
        {"record": f"dashboard:query_{i}", "expr": m.as_promql(expr)}
        for i, expr in enumerate(dashboard.values())
    ]
    rules = tmp_path / "dashboard.yaml"
    rules.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": recorded}]}))

    proc = m.run_promtool(promtool, "check", "rules", str(rules))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(recorded)} rules found" in proc.stdout


def test_promtool_check_rules_fails_on_a_broken_rule(
    promtool: Path, monitored: list[dict[str, Any]], tmp_path: Path
) -> None:
    groups = m.rule_groups(monitored)
    groups[0]["rules"][1]["expr"] += " >"  # a comparison with nothing on its right
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": groups}))

    proc = m.run_promtool(promtool, "check", "rules", str(rules))
    assert proc.returncode != 0
    assert "TrainingRunNoCommit" in proc.stdout + proc.stderr or "parse" in proc.stderr


@pytest.mark.parametrize(
    "source",
    [
        pytest.param("operator", id="operator-leading-with-a-run"),
        pytest.param("sidecar", id="sync-sidecar"),
        pytest.param("restore", id="restore"),
    ],
)
def test_promtool_check_metrics_passes_on_the_real_exposition(promtool: Path, source: str) -> None:
    registries = {
        "operator": m.operator_registry([m.full_run()]),
        "sidecar": m.agent_registries()[0],
        "restore": m.agent_registries()[1],
    }
    text = m.exposition(registries[source])
    assert "trainingrun_" in text

    proc = m.run_promtool(promtool, "check", "metrics", stdin=text)
    assert proc.returncode == 0, proc.stdout + proc.stderr


SCENARIOS = Path(__file__).with_name("alert_scenarios.yaml")


def run_scenarios(promtool: Path, helm: Path, rule_values: dict[str, Any], at: Path) -> Any:
    values = {**m.MONITORING_ON}
    values["metrics"] = {**values["metrics"], "prometheusRule": {"enabled": True, **rule_values}}
    groups = m.rule_groups(m.render(helm, values))
    (at / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}))
    (at / "scenarios.yaml").write_text(SCENARIOS.read_text())
    return m.run_promtool(promtool, "test", "rules", str(at / "scenarios.yaml"))


def test_promtool_test_rules_each_alert_fires_when_it_should_and_not_otherwise(
    promtool: Path, helm: Path, tmp_path: Path
) -> None:
    """tests/chart/alert_scenarios.yaml: a run that stops committing, one that commits, one
    resumed after a wait, one with a single commit; a run nearing its restart budget, one that
    ended, one with a budget of 0; low, young and good goodput; a leader gone, none scraped,
    a handover."""
    proc = run_scenarios(promtool, helm, {}, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


@pytest.mark.parametrize(
    ("rule_values", "alert"),
    [
        pytest.param({"noCommit": {"missedSaves": 30}}, "TrainingRunNoCommit", id="no-commit"),
        pytest.param(
            {"restartBudget": {"restartsLeft": 0}}, "TrainingRunNearRestartBudget", id="budget"
        ),
        pytest.param({"lowGoodput": {"threshold": 0.2}}, "TrainingRunLowGoodput", id="goodput"),
        pytest.param({"noLeader": {"for": "30m"}}, "TrainingRunOperatorNotLeading", id="leader"),
    ],
)
def test_promtool_test_rules_scenarios_fail_when_an_alert_does_not_fire(
    promtool: Path, helm: Path, tmp_path: Path, rule_values: dict[str, Any], alert: str
) -> None:
    """The scenarios assert: with a threshold that keeps an alert from firing, they fail on it."""
    proc = run_scenarios(promtool, helm, rule_values, tmp_path)
    assert proc.returncode != 0
    assert f'alertname=\\"{alert}\\"' in proc.stdout + proc.stderr
    assert "got: nil" in proc.stdout + proc.stderr
