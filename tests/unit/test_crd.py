"""The generated CustomResourceDefinition.

Covers:

- ``crds/trainingrun.yaml`` equals ``crd.render()`` (stale check; the failure says to run
  ``make crds``) and parses back to ``build_crd()``;
- the schema is structural: no ``$ref``, ``anyOf``, ``title`` or ``$defs`` anywhere, and every
  property has a type (or is an int-or-string, or keeps unknown fields on purpose);
- every property at every depth (spec, status, array items) has a description, as ``kubectl
  explain`` shows it; only the root ``metadata`` is bare, because the API server accepts nothing
  but ``type: object`` there, and so are the pod template's generated fields, but for the parts
  the operator relies on (``crd.TEMPLATE_OVERLAY``);
- ``status.conditions`` is a list-map keyed by ``type`` (a required field of its items);
- the CEL rules sit where the API expects them;
- the pod template is Kubernetes' PodTemplateSpec: quantities are int-or-strings with
  controller-gen's pattern (which refuses ``lots``), a container's fields are the known ones (no
  ``comand``), only ObjectMeta keeps unknown fields, list-map markers and the defaults of list-map
  keys are kept, no empty-object defaults; container, init container and volume names may not
  take the operator's ``trainingrun-`` prefix, with bounds that keep the rules' cost low;
- the data file ``podtemplate.schema.json`` is of the Kubernetes release hack/k8s/go.mod builds
  and is what hack/podtemplate_schema.py makes of its OpenAPI (skipped when the Go module cache
  lacks it); the generator's conversion on a small document;
- the CRD, as JSON, fits kubectl apply's last-applied annotation with room to spare;
- printer columns: Phase, Attempt, Restarts, Preemptions, Checkpoint, Age, Replicas, Format,
  Reason, Message in that order, with Replicas, Format, Reason and Message at priority 1 and the
  others in the default view;
- ``docs/api-reference.md`` equals ``apidoc.render()``, and the rendered reference has a section
  per object and a row per field of spec and status, with its default and enum values, and no row
  with an empty description (checked on ``python -m trainingrun.api.reference``'s output) but below
  ``spec.template``.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any, get_args

import pytest
import yaml

from trainingrun import api, contract
from trainingrun.api import crd
from trainingrun.api import reference as apidoc
from trainingrun.checkpoint import layouts

REPO = Path(__file__).resolve().parents[2]
CRD_FILE = REPO / "crds" / "trainingrun.yaml"


def _load_generator() -> ModuleType:
    """hack/podtemplate_schema.py, which writes operator/trainingrun/podtemplate.schema.json."""
    path = REPO / "hack" / "podtemplate_schema.py"
    spec = importlib.util.spec_from_file_location("podtemplate_schema", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GENERATOR = _load_generator()


def _schema() -> dict[str, Any]:
    schema: dict[str, Any] = crd.build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def _template(path: str = "") -> dict[str, Any]:
    """The node of spec.template at a dotted path (``[]`` steps into a list's items)."""
    node: dict[str, Any] = _schema()["properties"]["spec"]["properties"]["template"]
    for part in filter(None, path.split(".")):
        node = node["properties"][part.removesuffix("[]")]
        if part.endswith("[]"):
            node = node["items"]
    return node


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
        if "type" not in node
        and not node.get("x-kubernetes-preserve-unknown-fields")
        and not node.get("x-kubernetes-int-or-string")
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
    """What ``kubectl explain`` shows: every field at every depth, array items included, but the
    pod template's generated fields (PodTemplateSpec, documented by Kubernetes, kept bare for the
    CRD's size); the parts of it the operator relies on are checked below."""
    schema = _schema()
    undescribed = list(_undescribed(schema, ""))

    assert schema.get("description")
    # The root metadata may hold nothing but its type (the API server rejects even a description
    # there) and kubectl explain shows ObjectMeta's own documentation for it.
    assert [p for p in undescribed if not p.startswith(".spec.template.")] == [".metadata"]


@pytest.mark.parametrize("path", list(crd.TEMPLATE_OVERLAY))
def test_template_parts_the_operator_relies_on_are_described(path: str) -> None:
    assert str(_template(path).get("description") or "").strip()


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


# -- the pod template: Kubernetes' PodTemplateSpec ------------------------------------------


@pytest.mark.parametrize("path", ["spec.containers[]", "spec.initContainers[]"])
def test_quantities_are_int_or_string_with_controller_gens_pattern(path: str) -> None:
    resources = _template(path)["properties"]["resources"]["properties"]
    quantity = {"x-kubernetes-int-or-string": True, "pattern": GENERATOR.QUANTITY_PATTERN}

    assert resources["limits"]["additionalProperties"] == quantity
    assert resources["requests"]["additionalProperties"] == quantity


@pytest.mark.parametrize(
    ("value", "valid"),
    [
        ("1", True),
        ("500m", True),
        ("1.5", True),
        ("16Gi", True),
        ("2e3", True),
        ("lots", False),
        ("1GB", False),
        ("1 Gi", False),
        ("", False),
    ],
)
def test_the_quantity_pattern(value: str, valid: bool) -> None:
    assert (re.fullmatch(GENERATOR.QUANTITY_PATTERN, value) is not None) is valid


@pytest.mark.parametrize("path", ["spec.containers[]", "spec.initContainers[]"])
def test_container_fields_are_the_known_ones(path: str) -> None:
    """An unknown field such as ``comand`` is named at apply (strict field validation)."""
    container = _template(path)

    assert {"name", "image", "command", "args", "env", "resources"} <= set(container["properties"])
    assert "comand" not in container["properties"]
    assert "x-kubernetes-preserve-unknown-fields" not in container


def test_only_object_metadata_keeps_unknown_fields() -> None:
    """ObjectMeta is labels and annotations (maps of strings), the rest kept unchecked, as the
    operator sets the pod's name, namespace and owner; nothing else in the template is open."""
    open_nodes = [
        path
        for path, node in _walk(_template())
        if isinstance(node, dict) and node.get("x-kubernetes-preserve-unknown-fields")
    ]
    metadata = _template("metadata")

    assert "/properties/metadata" in open_nodes
    assert all(path.endswith("/metadata") for path in open_nodes), open_nodes
    assert metadata["properties"] == {
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
    }


def test_list_markers_are_kept() -> None:
    containers, ports = _template("spec.containers"), _template("spec.containers[].ports")

    assert containers["x-kubernetes-list-type"] == "map"
    assert containers["x-kubernetes-list-map-keys"] == ["name"]
    assert ports["x-kubernetes-list-map-keys"] == ["containerPort", "protocol"]
    # A list-map key must be required or defaulted (the API server checks).
    assert ports["items"]["properties"]["protocol"]["default"] == "TCP"
    pull_secret = _template("spec.imagePullSecrets[]")
    assert pull_secret["properties"]["name"]["default"] == ""
    assert pull_secret["x-kubernetes-map-type"] == "atomic"


def test_no_empty_object_defaults() -> None:
    """openapi-gen's ``default: {}`` of every struct field would make the API server add empty
    objects all over a stored run; only real defaults are kept."""
    defaults = [
        (path, node["default"])
        for path, node in _walk(_template())
        if isinstance(node, dict) and "default" in node
    ]

    assert defaults
    assert all(value not in ({}, [], 0) for _, value in defaults), defaults


@pytest.mark.parametrize("where", ["containers", "initContainers", "volumes"])
def test_operator_names_are_reserved(where: str) -> None:
    field = f"spec.template.spec.{where}[].name"
    rules = _template(f"spec.{where}[].name")["x-kubernetes-validations"]

    assert [r["rule"] for r in rules] == ["!self.startsWith('trainingrun-')"]
    assert field in rules[0]["message"]
    assert "reserved for" in rules[0]["message"]
    # The API server estimates each rule's cost from these bounds.
    assert _template(f"spec.{where}")["maxItems"] <= 256
    assert _template(f"spec.{where}[].name")["maxLength"] == 63


def test_the_names_the_operator_adds_carry_the_reserved_prefix() -> None:
    ours = [
        contract.RESTORE_CONTAINER,
        contract.SYNC_CONTAINER,
        contract.CHECKPOINT_VOLUME,
        contract.PODINFO_VOLUME,
    ]

    assert all(name.startswith(crd.RESERVED_PREFIX) for name in ours), ours
    assert not contract.TRAINER_CONTAINER.startswith(crd.RESERVED_PREFIX)


def test_crd_fits_kubectl_apply_annotation() -> None:
    """Client-side ``kubectl apply`` stores the whole object as JSON in an annotation, and all of
    an object's annotations together may hold 256 KiB; leave room for growth."""
    size = len(json.dumps(crd.build_crd(), separators=(",", ":")))

    assert size < 160 * 1024, size


def test_pod_template_schema_is_of_the_release_the_project_builds() -> None:
    source = crd.podtemplate_source()

    assert source["module"] == "k8s.io/kubernetes"
    assert source["version"] == GENERATOR.k8s_version(), (
        "hack/k8s/go.mod builds another Kubernetes: run .venv/bin/python hack/podtemplate_schema.py"
    )


def test_pod_template_schema_file_is_current() -> None:
    """The data file is what the generator makes of the pinned release's OpenAPI document."""
    source = GENERATOR.find_source(GENERATOR.k8s_version())
    if source is None:
        pytest.skip("k8s.io/kubernetes is not in the Go module cache (hack/build-tools.sh)")

    assert GENERATOR.DATA_FILE.read_text() == GENERATOR.build(source), (
        "operator/trainingrun/podtemplate.schema.json is stale: run "
        ".venv/bin/python hack/podtemplate_schema.py"
    )


def _ref(name: str) -> dict[str, Any]:
    return {"allOf": [{"$ref": f"#/components/schemas/{name}"}], "default": {}}


def test_generator_converts_openapi_to_a_structural_schema() -> None:
    """Refs inlined, cycles cut, quantities and int-or-strings marked, descriptions, zero
    defaults and patch extensions dropped; a list-map key keeps even a zero default."""
    q, ios = GENERATOR.QUANTITY, GENERATOR.INT_OR_STRING
    defs = {
        "Node": {
            "type": "object",
            "description": "dropped",
            "properties": {
                "child": _ref("Node"),
                "size": {"$ref": f"#/components/schemas/{q}"},
                "port": _ref(ios),
                "count": {"type": "integer", "format": "int32", "default": 0},
                "proto": {"type": "string", "default": "TCP"},
                "refs": {
                    "type": "array",
                    "items": _ref("Ref"),
                    "x-kubernetes-list-type": "map",
                    "x-kubernetes-list-map-keys": ["name"],
                    "x-kubernetes-patch-strategy": "merge",
                },
            },
        },
        "Ref": {"type": "object", "properties": {"name": {"type": "string", "default": ""}}},
        q: {"oneOf": [{"type": "string"}, {"type": "number"}]},
        ios: {"format": "int-or-string", "oneOf": [{"type": "integer"}, {"type": "string"}]},
    }

    out = GENERATOR.convert(defs["Node"], defs, ("Node",))

    assert out == {
        "type": "object",
        "properties": {
            "child": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
            "size": {"x-kubernetes-int-or-string": True, "pattern": GENERATOR.QUANTITY_PATTERN},
            "port": {"x-kubernetes-int-or-string": True},
            "count": {"type": "integer", "format": "int32"},
            "proto": {"type": "string", "default": "TCP"},
            "refs": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"name": {"type": "string", "default": ""}},
                },
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["name"],
            },
        },
    }


def test_printer_columns() -> None:
    columns = crd.build_crd()["spec"]["versions"][0]["additionalPrinterColumns"]

    assert [c["name"] for c in columns] == [
        "Phase",
        "Attempt",
        "Restarts",
        "Preemptions",
        "Checkpoint",
        "Progress",
        "ETA",
        "Age",
        "Step",
        "Goodput",
        "Replicas",
        "Format",
        "Reason",
        "Message",
    ]
    priorities = {c["name"]: c.get("priority", 0) for c in columns}
    assert {name for name, p in priorities.items() if p == 1} == {
        "Step",
        "Goodput",
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
        [sys.executable, "-m", "trainingrun.api.reference"],
        capture_output=True,
        text=True,
        check=True,
    )
    rows = list(_field_rows(result.stdout))
    # The pod template's generated fields are bare (Kubernetes documents PodTemplateSpec): the
    # reference lists only the ones the operator describes.
    empty = [f"{section} {cells[0]}" for section, cells in rows if not cells[-1]]

    assert rows
    assert all(len(cells) == 5 for _, cells in rows), "a field row does not have 5 cells"
    assert empty == []


def test_the_format_enum_is_the_layouts_formats() -> None:
    """spec.checkpoint.format lists exactly auto, pattern and every layout rule."""
    expected = {layouts.AUTO, layouts.PATTERN, *layouts.FORMATS}
    assert set(get_args(api.CheckpointFormat)) == expected
