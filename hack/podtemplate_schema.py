"""Generates operator/trainingrun/api/podtemplate.schema.json: the structural schema of a Kubernetes
PodTemplateSpec, as controller-gen would write it for a Go field of that type, from the OpenAPI v3
document of core/v1 in the Kubernetes release the project builds (k8s.io/kubernetes in
hack/k8s/go.mod, read from the Go module cache).

    .venv/bin/python hack/podtemplate_schema.py            # write the data file
    .venv/bin/python hack/podtemplate_schema.py --check    # exit 1 when it is stale
    .venv/bin/python hack/podtemplate_schema.py --openapi api__v1_openapi.json  # another source

The conversion (JSONSchemaProps has no refs, and a CRD schema must be structural):

- refs (``$ref`` and ``allOf: [{$ref}]``) are inlined; a type met again below itself is cut to
  ``type: object`` with unknown fields kept (core/v1's pod has no such cycle today);
- ObjectMeta becomes labels and annotations (maps of strings) with every other field kept as
  is, unchecked: the operator sets the pod's name, namespace and owner itself;
- Quantity becomes controller-gen's ``x-kubernetes-int-or-string`` with its pattern, so
  ``cpu: lots`` is refused at apply; IntOrString becomes ``x-kubernetes-int-or-string``;
- descriptions are dropped (size: the CRD stays well under what ``kubectl apply`` can store in its
  last-applied annotation); crd.py describes the parts the operator relies on;
- the zero-value defaults openapi-gen writes for every non-omitempty field are dropped (a CRD
  would apply them); the explicit ones (``protocol: TCP``, ``fsType: ext4``) and those of
  list-map keys (the API server requires a default or ``required`` there) are kept;
- list and map markers are kept: ``x-kubernetes-list-type``, ``x-kubernetes-list-map-keys``,
  ``x-kubernetes-map-type``; the patch-strategy and union extensions, which a CRD does not take,
  are dropped.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
GO_MOD = REPO / "hack" / "k8s" / "go.mod"
DATA_FILE = REPO / "operator" / "trainingrun" / "api" / "podtemplate.schema.json"
MODULE = "k8s.io/kubernetes"
SOURCE = "api/openapi-spec/v3/api__v1_openapi.json"

PREFIX = "#/components/schemas/"
ROOT = "io.k8s.api.core.v1.PodTemplateSpec"
OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
QUANTITY = "io.k8s.apimachinery.pkg.api.resource.Quantity"
INT_OR_STRING = "io.k8s.apimachinery.pkg.util.intstr.IntOrString"
# controller-gen's pattern for resource.Quantity (sigs.k8s.io/controller-tools, known_types.go).
QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?"
    r"(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)

# What a structural CRD schema takes from the OpenAPI; everything else is dropped.
KEPT = (
    "type",
    "format",
    "required",
    "enum",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-map-type",
)
STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
METADATA: dict[str, Any] = {
    "type": "object",
    "x-kubernetes-preserve-unknown-fields": True,
    "properties": {"labels": STRING_MAP, "annotations": STRING_MAP},
}
ZERO_VALUES: tuple[object, ...] = ("", 0, False, {}, [])


def k8s_version(go_mod: Path = GO_MOD) -> str:
    """The k8s.io/kubernetes version hack/k8s/go.mod requires (hack/build-tools.sh builds it)."""
    for line in go_mod.read_text().splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] == MODULE and parts[1].startswith("v"):
            return parts[1]
    raise SystemExit(f"{go_mod} requires no {MODULE} version")


def find_source(version: str, download: bool = False) -> Path | None:
    """The OpenAPI document in the Go module cache (downloaded into it if asked), else None."""
    try:
        cache = subprocess.run(
            ["go", "env", "GOMODCACHE"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    path = Path(cache) / f"{MODULE}@{version}" / SOURCE
    if not path.exists() and download:
        env = {**os.environ, "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=mod"}
        subprocess.run(
            ["go", "mod", "download", f"{MODULE}@{version}"], cwd=GO_MOD.parent, env=env, check=True
        )
    return path if path.exists() else None


def _ref(node: dict[str, Any]) -> str | None:
    if "$ref" in node:
        return str(node["$ref"]).removeprefix(PREFIX)
    refs = [n["$ref"] for n in node.get("allOf", []) if "$ref" in n]
    return str(refs[0]).removeprefix(PREFIX) if len(refs) == 1 else None


def _default(node: dict[str, Any], map_key: bool) -> dict[str, Any]:
    if "default" not in node:
        return {}
    value = node["default"]
    zero = any(value == z and type(value) is type(z) for z in ZERO_VALUES)
    return {"default": value} if map_key or not zero else {}


def convert(
    node: dict[str, Any],
    defs: dict[str, Any],
    seen: tuple[str, ...] = (),
    keys: frozenset[str] = frozenset(),
    is_key: bool = False,
) -> dict[str, Any]:
    """One OpenAPI schema node as a structural CRD schema node (see the module docstring).

    ``keys`` are the list-map keys of the list whose items ``node`` describes; ``is_key`` says
    that ``node`` is one of them and not required, so it keeps its default even a zero one.
    """
    name = _ref(node)
    if name == OBJECT_META:
        return copy.deepcopy(METADATA)
    if name == QUANTITY:
        return {"x-kubernetes-int-or-string": True, "pattern": QUANTITY_PATTERN}
    if name == INT_OR_STRING:
        return {"x-kubernetes-int-or-string": True}
    if name in seen:
        return {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    if name is not None:
        target = convert(defs[name], defs, (*seen, name), keys, is_key)
        return {**target, **_default(node, is_key)}
    out: dict[str, Any] = {k: node[k] for k in KEPT if k in node}
    out.update(_default(node, is_key))
    if out.get("format") == "int-or-string":
        del out["format"]
    required = set(node.get("required", []))
    if "properties" in node:
        out["properties"] = {
            prop: convert(sub, defs, seen, is_key=prop in keys and prop not in required)
            for prop, sub in node["properties"].items()
        }
    if "items" in node:
        item_keys = frozenset(node.get("x-kubernetes-list-map-keys", []))
        out["items"] = convert(node["items"], defs, seen, item_keys)
    if isinstance(node.get("additionalProperties"), dict):
        out["additionalProperties"] = convert(node["additionalProperties"], defs, seen)
    return out


def generate(document: dict[str, Any], version: str, digest: str) -> dict[str, Any]:
    """The data file: where the schema came from, and the schema."""
    defs = document["components"]["schemas"]
    return {
        "source": {"module": MODULE, "version": version, "file": SOURCE, "sha256": digest},
        "generator": "hack/podtemplate_schema.py",
        "schema": convert(defs[ROOT], defs, (ROOT,)),
    }


def render(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=1, sort_keys=True) + "\n"


def build(openapi: Path | None = None, download: bool = True) -> str:
    """The data file's text, generated from ``openapi`` or the pinned release's document."""
    version = k8s_version()
    source = openapi or find_source(version, download=download)
    if source is None:
        raise SystemExit(f"{MODULE}@{version}/{SOURCE} is not in the Go module cache")
    raw = source.read_bytes()
    return render(generate(json.loads(raw), version, hashlib.sha256(raw).hexdigest()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="fail when the data file is stale")
    parser.add_argument("--openapi", type=Path, help="the api__v1_openapi.json to read")
    args = parser.parse_args(argv)
    text = build(args.openapi)
    if args.check:
        if DATA_FILE.read_text() != text:
            print(f"{DATA_FILE.relative_to(REPO)} is stale: run {sys.argv[0]}", file=sys.stderr)
            return 1
        return 0
    DATA_FILE.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
