"""Rendering the chart with the helm binary that hack/build-tools.sh builds."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from tests.chart.rbac import Grant

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "trainingrun"


def helm_run(helm: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(helm), *args], input=stdin, capture_output=True, text=True, check=False, timeout=120
    )


def template(
    helm: Path,
    values: dict[str, Any] | None = None,
    *,
    release: str = "tr",
    namespace: str = "trainingrun-system",
    include_crds: bool = False,
) -> list[dict[str, Any]]:
    """``helm template`` of the chart with ``values``; the rendered objects."""
    args = ["template", release, str(CHART), "--namespace", namespace, "--values", "-"]
    if include_crds:
        args.append("--include-crds")
    proc = helm_run(helm, *args, stdin=json.dumps(values or {}))
    if proc.returncode != 0:
        raise AssertionError(f"helm template failed: {proc.stderr}")
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


def only(objects: Iterable[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [
        o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)
    ]
    assert len(found) == 1, f"expected one {kind} {name or ''}, got {len(found)}"
    return found[0]


def of_kind(objects: Iterable[dict[str, Any]], *kinds: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] in kinds]


def grants(role: dict[str, Any]) -> set[Grant]:
    return {
        (group, resource, verb)
        for rule in role.get("rules") or []
        for group in rule.get("apiGroups") or []
        for resource in rule.get("resources") or []
        for verb in rule.get("verbs") or []
    }
