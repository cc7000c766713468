"""What the monitoring tests share: a run whose status has every field the per-run metrics read,
the exposition of every metric the operator and the agents really export, the chart rendered
with its monitoring on, the PromQL of its rules and dashboard, and the metric names in PromQL.

The names come from the real classes (``OperatorMetrics``, ``RunCollector`` through
``export_runs_with``, ``LeaderFlag``, the sync sidecar's and the restore's ``Metrics``, and the
client's process, platform and GC collectors that the operator's default registry holds), read
back from their text exposition: never from a list written here.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    generate_latest,
)
from prometheus_client.parser import text_string_to_metric_families

from tests.chart.support import CHART, helm_run
from trainingrun.agent import restore, sidecar
from trainingrun.operator.metrics import LeaderFlag, OperatorMetrics

MONITORING_API = "monitoring.coreos.com/v1"
# Every monitoring object of the chart on, with the agents serving on the pod's IP.
MONITORING_ON: dict[str, Any] = {
    "agent": {"metrics": "pod"},
    "metrics": {
        "serviceMonitor": {"enabled": True},
        "podMonitor": {"enabled": True},
        "prometheusRule": {"enabled": True},
        "dashboard": {"enabled": True},
    },
}
DASHBOARD = CHART / "dashboards" / "trainingrun.json"

# A run in the middle of its third attempt, with every status field the per-run metrics read
# (the goodput ledger in both shapes: ``ratio`` as issue 47 sketches it, ``percent`` as the API
# writes it).
FULL_RUN: dict[str, Any] = {
    "metadata": {"namespace": "team-a", "name": "llm-7b"},
    "spec": {"restartPolicy": {"maxRestarts": 5}},
    "status": {
        "phase": "Running",
        "attempt": 3,
        "restarts": 1,
        "preemptions": 2,
        "conditions": [
            {"type": "Running", "status": "True", "lastTransitionTime": "2026-11-29T09:00:00Z"},
            {"type": "Succeeded", "status": "False", "lastTransitionTime": "2026-11-29T08:00:00Z"},
        ],
        "latestCheckpoint": {
            "step": 400,
            "uri": "s3://ckpt/team-a/llm-7b/checkpoints/checkpoint-400",
            "time": "2026-11-29T10:00:00.250000Z",
        },
        "progress": {
            "step": 480,
            "totalSteps": 1000,
            "percent": 48.0,
            "stepsPerSecond": 2.5,
            "etaSeconds": 208,
            "observedAt": "2026-11-29T10:05:00Z",
            "summary": "48%",
            "attempt": 3,
        },
        "goodput": {
            "wallSeconds": 7200.0,
            "productiveSeconds": 6000.0,
            "lostSeconds": 300.0,
            "startupSeconds": 400.0,
            "waitingSeconds": 450.0,
            "stallSeconds": 50.0,
            "ratio": 0.8333,
            "percent": 83.33,
            "stepsLost": {"eviction": 10, "notice": 0, "nodeLost": 5, "sigkill": 3, "other": 1},
            "observedAt": "2026-11-29T10:05:00Z",
        },
    },
}


def full_run(namespace: str = "team-a", name: str = "llm-7b") -> dict[str, Any]:
    run = copy.deepcopy(FULL_RUN)
    run["metadata"] = {"namespace": namespace, "name": name}
    return run


def operator_registry(runs: Iterable[dict[str, Any]] = (), leading: bool = True) -> Any:
    """A registry holding what the operator process's default registry holds: the client's
    process, platform and GC collectors, ``OperatorMetrics`` with the per-run collector, and
    the leader flag."""
    registry = CollectorRegistry()
    for default in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
        registry.register(default)
    metrics = OperatorMetrics(registry)
    held = list(runs)
    metrics.export_runs_with(lambda: held, keep_finished_seconds=3600)
    flag = LeaderFlag(registry)
    if leading:
        flag.leading()
    return registry


def agent_registries() -> list[Any]:
    """The sync sidecar's and the restore's registries, as each agent makes them."""
    return [sidecar.Metrics().registry, restore.Metrics().registry]


def exposition(registry: Any) -> str:
    return generate_latest(registry).decode()


# The series a family of each type exposes, beside those its samples show (a labelled family
# with no child yet exposes only its HELP and TYPE lines).
SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "summary": ("", "_count", "_sum", "_created"),
    "info": ("_info",),
    "stateset": ("",),
    "gaugehistogram": ("_bucket", "_gcount", "_gsum"),
    "unknown": ("",),
}


def series_names(text: str) -> set[str]:
    """Every series name a Prometheus scraping ``text`` (a text exposition) can store."""
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        names.update(family.name + suffix for suffix in SUFFIXES[family.type])
        names.update(sample.name for sample in family.samples)
    return names


def exported_names() -> set[str]:
    """The names the operator (a leader with one run of every field) and the agents export."""
    texts = [exposition(operator_registry([full_run()]))]
    texts += [exposition(r) for r in agent_registries()]
    return set().union(*(series_names(t) for t in texts))


# -- the chart ---------------------------------------------------------------------------------


def render(
    helm: Path,
    values: dict[str, Any] | None = None,
    *,
    api_versions: Iterable[str] = (MONITORING_API,),
    release: str = "tr",
    namespace: str = "trainingrun-system",
) -> list[dict[str, Any]]:
    """``helm template`` with the cluster's API versions given (``--api-versions``)."""
    args = ["template", release, str(CHART), "--namespace", namespace, "--values", "-"]
    for api in api_versions:
        args += ["--api-versions", api]
    proc = helm_run(helm, *args, stdin=json.dumps(values or {}))
    if proc.returncode != 0:
        raise AssertionError(f"helm template failed: {proc.stderr}")
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


def rule_groups(objects: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    (rule,) = [o for o in objects if o["kind"] == "PrometheusRule"]
    groups: list[dict[str, Any]] = rule["spec"]["groups"]
    return groups


def rules(groups: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for group in groups:
        yield from group["rules"]


def dashboard_of(objects: Iterable[dict[str, Any]]) -> dict[str, Any]:
    (config_map,) = [o for o in objects if o["kind"] == "ConfigMap" and "dashboard" in str(o)]
    (text,) = config_map["data"].values()
    dashboard: dict[str, Any] = json.loads(text)
    return dashboard


def _panels(panels: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels") or [])


def dashboard_queries(dashboard: dict[str, Any]) -> dict[str, str]:
    """Every PromQL of the dashboard, by where it is: each panel target's ``expr``, and the
    expression inside each query variable's ``label_values(...)`` or ``query_result(...)``."""
    found: dict[str, str] = {}
    for panel in _panels(dashboard.get("panels") or []):
        for target in panel.get("targets") or []:
            found[f"panel {panel['title']!r} {target['refId']}"] = target["expr"]
    for var in dashboard.get("templating", {}).get("list", []):
        if var.get("type") != "query":
            continue
        query = var["query"]
        query = query.get("query", "") if isinstance(query, dict) else query
        found[f"variable {var['name']}"] = grafana_variable_expr(query)
    return found


def grafana_variable_expr(query: str) -> str:
    """The PromQL inside a Grafana query variable's function (label_values(expr, label) or
    query_result(expr)); an empty selector for label_values(label) alone."""
    m = re.fullmatch(r"\s*label_values\((.*),\s*[A-Za-z_][A-Za-z0-9_]*\s*\)\s*", query, re.S)
    if m:
        return m.group(1)
    m = re.fullmatch(r"\s*query_result\((.*)\)\s*", query, re.S)
    if m:
        return m.group(1)
    raise AssertionError(f"a Grafana variable query this test cannot read: {query!r}")


# Grafana's own variables that stand for a range, as Prometheus would be sent them.
GRAFANA_RANGES = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h"}


def as_promql(expr: str) -> str:
    """A dashboard expression as Grafana sends it: its ranges filled in. The dashboard's own
    variables appear only inside label matchers' strings, which stay as they are."""
    for var, value in GRAFANA_RANGES.items():
        expr = expr.replace(var, value)
    return expr


# -- metric names in PromQL ----------------------------------------------------------------------

_TOKEN = re.compile(
    r"""
    (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
    |(?P<comment>\#[^\n]*)
    |(?P<duration>(?:\d+(?:ms|[smhdwy]))+)
    |(?P<number>0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
    |(?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)
    |(?P<punct>[{}()\[\],@])
    |(?P<op>==|!=|=~|!~|<=|>=|[-+*/%^<>=])
    |(?P<space>\s+)
    """,
    re.VERBOSE,
)
# Words that are PromQL, never a metric: binary and set operators, modifiers, and the words that
# open a list of labels.
_KEYWORDS = frozenset(
    {"and", "or", "unless", "atan2", "bool", "offset", "inf", "nan", "start", "end"}
)
_GROUPING = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})
_AGGREGATIONS = frozenset(
    {
        "sum",
        "min",
        "max",
        "avg",
        "group",
        "stddev",
        "stdvar",
        "count",
        "count_values",
        "bottomk",
        "topk",
        "quantile",
        "limitk",
        "limit_ratio",
    }
)


def tokens(expr: str) -> list[tuple[str, str]]:
    out, at = [], 0
    while at < len(expr):
        m = _TOKEN.match(expr, at)
        if not m:
            raise ValueError(f"cannot read PromQL at {expr[at : at + 20]!r} in {expr!r}")
        kind = m.lastgroup or ""
        if kind not in ("space", "comment"):
            out.append((kind, m.group()))
        at = m.end()
    return out


def metric_names(expr: str) -> set[str]:
    """The metric names an expression selects. Every identifier that is not a function, an
    aggregation, a keyword, a label (inside ``{...}`` or the parentheses after by, without, on,
    ignoring, group_left, group_right) or part of a range counts: a word this reader does not
    know is taken for a metric, so a misreading fails the check rather than passing it."""
    toks = tokens(expr)
    names: set[str] = set()
    braces = brackets = 0
    parens: list[bool] = []  # per open parenthesis: whether it lists labels
    for i, (kind, text) in enumerate(toks):
        following = toks[i + 1] if i + 1 < len(toks) else ("", "")
        if kind == "punct":
            if text == "{":
                braces += 1
            elif text == "}":
                braces -= 1
            elif text == "[":
                brackets += 1
            elif text == "]":
                brackets -= 1
            elif text == "(":
                before = toks[i - 1][1].lower() if i else ""
                parens.append(before in _GROUPING)
            elif text == ")" and parens:
                parens.pop()
            continue
        if kind != "ident" or braces or brackets or (parens and parens[-1]):
            continue
        word = text.lower()
        if word in _KEYWORDS or word in _GROUPING or following == ("punct", "("):
            continue
        if word in _AGGREGATIONS and following[0] == "ident" and following[1].lower() in _GROUPING:
            continue
        names.add(text)
    return names


def run_promtool(
    path: Path, *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(path), *args], input=stdin, capture_output=True, text=True, check=False, timeout=120
    )
