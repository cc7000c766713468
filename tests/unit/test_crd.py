"""The generated CustomResourceDefinition.

Covers:

- ``crds/trainingrun.yaml`` equals ``crd.render()`` (stale check; the failure says to run
  ``make crds``) and parses back to ``build_crd()``;
- the schema is structural: no ``$ref``, ``anyOf``, ``title`` or ``$defs`` anywhere, and every
  property has a type (or keeps unknown fields on purpose);
- every property at every depth (spec, status, the typed parts of the pod template, array items)
  has a description, as ``kubectl explain`` shows it; only the root ``metadata`` is bare, because
  the API server accepts nothing but ``type: object`` there;
- ``status.conditions`` is a list-map keyed by ``type`` (a required field of its items);
- the CEL rules sit where the API expects them;
- printer columns: Phase, Attempt, Restarts, Preemptions, Checkpoint, Age, Replicas, Format,
  Reason, Message in that order, with Replicas, Format, Reason and Message at priority 1 and the
  others in the default view;
- ``docs/api-reference.md`` equals ``apidoc.render()``, and the rendered reference has a section
  per object and a row per field of spec and status, with its default and enum values, and no row
  with an empty description (checked on ``python -m trainingrun.apidoc``'s output).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_args

import pytest
import yaml

from trainingrun import api, apidoc, crd, layouts

REPO = Path(__file__).resolve().parents[2]
CRD_FILE = REPO / "crds" / "trainingrun.yaml"


def _schema() -> dict[str, Any]:
    schema: dict[str, Any] = crd.build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def _walk(node: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """Every (path, node) in a nested structure of dicts and lists."""
    yield path, node
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _walk(value, f"{path}/{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _walk(value, f"{path}[{i}]")


def _properties(node: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every schema property below ``node`` as (dotted path, schema)."""
    for name, sub in (node.get("properties") or {}).items():
        yield f"{path}.{name}", sub
        yield from _properties(sub, f"{path}.{name}")
    if "items" in node:
        yield from _properties(node["items"], f"{path}[]")


def test_crd_file_is_not_stale() -> None:
    on_disk = CRD_FILE.read_text()

    assert on_disk == crd.render(), (
        f"{CRD_FILE.relative_to(REPO)} is stale: run `make crds` and commit it"
    )


def test_crd_file_parses_back_to_the_definition() -> None:
    assert yaml.safe_load(CRD_FILE.read_text()) == crd.build_crd()


@pytest.mark.parametrize("key", ["$ref", "anyOf", "title", "$defs"])
def test_schema_is_structural(key: str) -> None:
    found = [path for path, node in _walk(_schema()) if isinstance(node, dict) and key in node]

    assert found == [], f"{key!r} at {found}"


def test_every_schema_node_has_a_type() -> None:
    schema = _schema()
    untyped = [
        path
        for path, node in [("", schema), *_properties(schema, "")]
        if "type" not in node and not node.get("x-kubernetes-preserve-unknown-fields")
    ]

    assert untyped == []


def _undescribed(node: dict[str, Any], path: str) -> Iterator[str]:
    """Paths below ``node`` of every property, and every array's items, with no description."""
    for name, sub in (node.get("properties") or {}).items():
        if not str(sub.get("description") or "").strip():
            yield f"{path}.{name}"
        yield from _undescribed(sub, f"{path}.{name}")
    if "items" in node:
        if not str(node["items"].get("description") or "").strip():
            yield f"{path}[]"
        yield from _undescribed(node["items"], f"{path}[]")


def test_undescribed_walks_nested_objects_and_array_items() -> None:
    schema = {
        "properties": {
            "a": {"description": "ok", "properties": {"b": {"type": "string"}}},
            "c": {"description": "ok", "type": "array", "items": {"type": "string"}},
            "d": {
                "description": "ok",
                "type": "array",
                "items": {"description": "ok", "properties": {"e": {"description": " "}}},
            },
        }
    }

    assert list(_undescribed(schema, "")) == [".a.b", ".c[]", ".d[].e"]


def test_every_schema_field_has_a_description() -> None:
    """What ``kubectl explain`` shows: every field at every depth, array items included."""
    schema = _schema()

    assert schema.get("description")
    # The root metadata may hold nothing but its type (the API server rejects even a description
    # there) and kubectl explain shows ObjectMeta's own documentation for it.
    assert list(_undescribed(schema, "")) == [".metadata"]


def test_root_metadata_is_bare() -> None:
    assert _schema()["properties"]["metadata"] == {"type": "object"}


def test_conditions_are_a_list_map_keyed_by_type() -> None:
    conditions = _schema()["properties"]["status"]["properties"]["conditions"]

    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]
    assert "type" in conditions["items"]["required"]  # a map key must be required


def test_spec_covers_every_api_field() -> None:
    spec = _schema()["properties"]["spec"]

    assert set(spec["properties"]) == {
        field.alias or name for name, field in api.TrainingRunSpec.model_fields.items()
    }
    assert spec["required"] == ["template", "checkpoint"]


@pytest.mark.parametrize(
    ("path", "rule_has"),
    [
        pytest.param("template", "c.name == 'trainer'", id="template-needs-trainer"),
        pytest.param("template", "restartPolicy == 'Never'", id="template-restart-never"),
        pytest.param("checkpoint", "self.localPath != '/'", id="local-path-not-root"),
        pytest.param("checkpoint.storage", "startsWith('s3://')", id="storage-uri-s3"),
        pytest.param("replicas", "self == oldSelf", id="replicas-immutable"),
        pytest.param(
            "restartPolicy.backoff", "maxSeconds >= self.initialSeconds", id="backoff-max-ge-init"
        ),
    ],
)
def test_cel_rules_are_placed(path: str, rule_has: str) -> None:
    node = _schema()["properties"]["spec"]
    for part in path.split("."):
        node = node["properties"][part]

    rules = [r["rule"] for r in node["x-kubernetes-validations"]]
    assert any(rule_has in r for r in rules), rules


def test_printer_columns() -> None:
    columns = crd.build_crd()["spec"]["versions"][0]["additionalPrinterColumns"]

    assert [c["name"] for c in columns] == [
        "Phase",
        "Attempt",
        "Restarts",
        "Preemptions",
        "Checkpoint",
        "Age",
        "Replicas",
        "Format",
        "Reason",
        "Message",
    ]
    priorities = {c["name"]: c.get("priority", 0) for c in columns}
    assert {name for name, p in priorities.items() if p == 1} == {
        "Replicas",
        "Format",
        "Reason",
        "Message",
    }
    assert {p for p in priorities.values()} == {0, 1}
    status_fields = set(_schema()["properties"]["status"]["properties"])
    for c in columns:
        if c["jsonPath"].startswith(".status."):
            assert c["jsonPath"].split(".")[2] in status_fields, c


# -- the API reference generated from the CRD ------------------------------------------------

API_REFERENCE = REPO / "docs" / "api-reference.md"


def test_api_reference_is_current() -> None:
    assert API_REFERENCE.read_text() == apidoc.render(), (
        "docs/api-reference.md is stale: run 'make api-docs' and commit it"
    )


def _fields(path: str, schema: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(section path, field name, field schema) of every field the API models define."""
    for name, field in (schema.get("properties") or {}).items():
        yield path, name, field
        if name == "template" and path == "spec":
            continue  # PodTemplateSpec: documented by Kubernetes
        if field.get("properties"):
            yield from _fields(f"{path}.{name}", field)
        items = field.get("items") or {}
        if items.get("properties"):
            yield from _fields(f"{path}.{name}[]", items)


@pytest.mark.parametrize("root", ["spec", "status"])
def test_api_reference_has_a_row_for_every_field(root: str) -> None:
    text = apidoc.render()
    sections = {
        block.split("`", 2)[1]: block for block in text.split("\n## ")[1:] if block.startswith("`")
    }
    fields = list(_fields(root, _schema()["properties"][root]))
    assert fields
    for section, name, field in fields:
        assert section in sections, f"no section for {section}"
        row = next(
            (line for line in sections[section].splitlines() if line.startswith(f"| `{name}`")),
            None,
        )
        assert row is not None, f"{section}.{name} has no row"
        if "default" in field:
            assert json.dumps(field["default"]) in row, row
        for value in field.get("enum", []):
            assert f"`{value}`" in row, row


def _field_rows(text: str) -> Iterator[tuple[str, list[str]]]:
    """(section, cells) of every row of the field tables (not the printer-column table)."""
    section = ""
    for line in text.splitlines():
        if line.startswith("## "):
            section = line[3:].strip("`")
        elif section and line.startswith("| `"):
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
            yield section, cells


def test_api_reference_has_no_empty_description() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "trainingrun.apidoc"], capture_output=True, text=True, check=True
    )
    rows = list(_field_rows(result.stdout))
    empty = [f"{section} {cells[0]}" for section, cells in rows if not cells[-1]]

    assert rows
    assert all(len(cells) == 5 for _, cells in rows), "a field row does not have 5 cells"
    assert empty == []


def test_the_format_enum_is_the_layouts_formats() -> None:
    """spec.checkpoint.format lists exactly auto, pattern and every layout rule."""
    expected = {layouts.AUTO, layouts.PATTERN, *layouts.FORMATS}
    assert set(get_args(api.CheckpointFormat)) == expected
