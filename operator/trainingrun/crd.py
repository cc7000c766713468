"""Generates the TrainingRun CustomResourceDefinition from the models in ``trainingrun.api``.

``python -m trainingrun.crd`` prints it; ``make crds`` writes ``crds/trainingrun.yaml`` and
``make verify`` fails when that file is stale. The pydantic JSON schema is turned into a
structural schema (refs inlined, optional fields unwrapped, titles dropped), then the parts a
JSON schema cannot say are added: the pod template's shape, CEL rules, printer columns.
"""

from __future__ import annotations

import copy
import sys
from typing import Any

import yaml

from trainingrun import api
from trainingrun.contract import TRAINER_CONTAINER

# The pod template is kept open (any PodTemplateSpec field is allowed and the API server checks
# the real pod at creation), but the parts the operator and the CEL rules rely on are typed.
# Every typed field carries a description: it is what `kubectl explain` shows.
TEMPLATE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["spec"],
    "properties": {
        "metadata": {
            "type": "object",
            "x-kubernetes-preserve-unknown-fields": True,
            "description": (
                "Pod metadata (ObjectMeta). Its labels and annotations are copied to each "
                "attempt's pod; the operator sets the name, namespace and owner."
            ),
        },
        "spec": {
            "type": "object",
            "x-kubernetes-preserve-unknown-fields": True,
            "description": (
                "Pod spec (PodSpec) of each attempt. Any PodSpec field is allowed; the API server "
                "validates the pod when the operator creates it."
            ),
            "required": ["containers"],
            "properties": {
                "restartPolicy": {
                    "type": "string",
                    "maxLength": 16,
                    "description": (
                        "Must be Never or unset: the operator, not the kubelet, restarts a "
                        "failed attempt, from its newest checkpoint."
                    ),
                },
                "containers": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": 32,
                    "description": (
                        "Containers of the pod (Container); one must be named "
                        f"'{TRAINER_CONTAINER}'."
                    ),
                    "items": {
                        "type": "object",
                        "x-kubernetes-preserve-unknown-fields": True,
                        "description": "A container (Container): any Container field is allowed.",
                        "required": ["name"],
                        "properties": {
                            "name": {
                                "type": "string",
                                "maxLength": 253,
                                "description": (
                                    "Name of the container, unique in the pod. The operator "
                                    f"resumes the one named '{TRAINER_CONTAINER}'."
                                ),
                            },
                            "image": {
                                "type": "string",
                                "maxLength": 1024,
                                "description": (
                                    "Container image name; required for the "
                                    f"'{TRAINER_CONTAINER}' container."
                                ),
                            },
                        },
                    },
                },
            },
        },
    },
}

# CEL rules by schema path (dotted, from spec). Each message names the field and the fix.
RULES: dict[str, list[dict[str, str]]] = {
    "template": [
        {
            "rule": f"self.spec.containers.exists(c, c.name == '{TRAINER_CONTAINER}')",
            "message": (
                "spec.template.spec.containers must include a container named "
                f"'{TRAINER_CONTAINER}': the operator resumes that container"
            ),
        },
        {
            "rule": (
                f"self.spec.containers.all(c, c.name != '{TRAINER_CONTAINER}' || "
                "(has(c.image) && c.image != ''))"
            ),
            "message": "spec.template.spec.containers[name=trainer].image must be set",
        },
        {
            "rule": "!has(self.spec.restartPolicy) || self.spec.restartPolicy == 'Never'",
            "message": (
                "spec.template.spec.restartPolicy must be Never or unset: the operator restarts "
                "the run from its checkpoint, not the kubelet"
            ),
        },
    ],
    "replicas": [
        {
            "rule": "self == oldSelf",
            "message": (
                "spec.replicas cannot change while the run exists: delete the run and create it "
                "again with the new number (it resumes from its newest committed checkpoint)"
            ),
        },
    ],
    "checkpoint.storage": [
        {
            "rule": "self.uri.startsWith('s3://')",
            "message": "spec.checkpoint.storage.uri must start with s3:// (s3://bucket/prefix)",
        },
    ],
    "checkpoint": [
        {
            "rule": "self.localPath != '/'",
            "message": "spec.checkpoint.localPath must be a folder below /, not / itself",
        },
        {
            "rule": "self.format != 'pattern' || has(self.pattern)",
            "message": (
                "spec.checkpoint.format: pattern needs spec.checkpoint.pattern (glob, step, marker)"
            ),
        },
    ],
    "restartPolicy.backoff": [
        {
            "rule": "self.maxSeconds >= self.initialSeconds",
            "message": "spec.restartPolicy.backoff.maxSeconds must be >= initialSeconds",
        },
    ],
}

# Pod names are <run>-<attempt> and the run name is a label value (at most 63 characters).
MAX_RUN_NAME = 52
NAME_RULE = {
    "rule": f"self.metadata.name.size() <= {MAX_RUN_NAME}",
    "message": (
        f"metadata.name must be at most {MAX_RUN_NAME} characters: pod names are "
        "<run>-<attempt> and the run name is a label value"
    ),
}

PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Attempt", "type": "integer", "jsonPath": ".status.attempt"},
    {"name": "Restarts", "type": "integer", "jsonPath": ".status.restarts"},
    {"name": "Preemptions", "type": "integer", "jsonPath": ".status.preemptions"},
    {"name": "Checkpoint", "type": "integer", "jsonPath": ".status.latestCheckpoint.step"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    {"name": "Replicas", "type": "integer", "jsonPath": ".spec.replicas", "priority": 1},
    # Which format the sidecar recognised: the first thing to look at when a run is unprotected.
    {
        "name": "Format",
        "type": "string",
        "jsonPath": ".status.latestCheckpoint.format",
        "priority": 1,
    },
    {"name": "Reason", "type": "string", "jsonPath": ".status.reason", "priority": 1},
    {"name": "Message", "type": "string", "jsonPath": ".status.message", "priority": 1},
]

_DROP = {"title", "additionalProperties"}

# The standard descriptions of apiVersion and kind (as controller-gen writes them).
_CONVENTIONS = "https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md"
API_VERSION_DOC = (
    "APIVersion defines the versioned schema of this representation of an object. Servers "
    "should convert recognized schemas to the latest internal value, and may reject "
    f"unrecognized values. More info: {_CONVENTIONS}#resources"
)
KIND_DOC = (
    "Kind is a string value representing the REST resource this object represents. Servers may "
    "infer this from the endpoint the client submits requests to. Cannot be updated. In "
    f"CamelCase. More info: {_CONVENTIONS}#types-kinds"
)


def _structural(node: Any, defs: dict[str, Any]) -> Any:
    """Inlines refs, unwraps Optional (anyOf with null) and drops keys a CRD does not take."""
    if isinstance(node, list):
        return [_structural(n, defs) for n in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = copy.deepcopy(defs[node["$ref"].rsplit("/", 1)[-1]])
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return _structural(merged, defs)
    if "anyOf" in node:
        options = [o for o in node["anyOf"] if o.get("type") != "null"]
        if len(options) != 1:
            raise ValueError(f"cannot express anyOf {node['anyOf']} structurally")
        rest = {k: v for k, v in node.items() if k != "anyOf"}
        if rest.get("default", 0) is None:
            rest.pop("default")
        return _structural({**options[0], **rest}, defs)
    out = {k: _structural(v, defs) for k, v in node.items() if k not in _DROP and k != "$defs"}
    if out.get("type") == "array" and "maxLength" in out:
        out["maxItems"] = out.pop("maxLength")
    return out


def _at(schema: dict[str, Any], path: str) -> dict[str, Any]:
    node = schema
    for part in path.split("."):
        node = node["properties"][part]
    return node


def spec_schema() -> dict[str, Any]:
    raw = api.TrainingRunSpec.model_json_schema(by_alias=True, mode="validation")
    schema: dict[str, Any] = _structural(raw, raw.get("$defs", {}))
    template = _at(schema, "template")
    description = template["description"]
    template.clear()
    template.update(copy.deepcopy(TEMPLATE_SCHEMA), description=description)
    for path, rules in RULES.items():
        _at(schema, path)["x-kubernetes-validations"] = rules
    return schema


def status_schema() -> dict[str, Any]:
    raw = api.TrainingRunStatus.model_json_schema(by_alias=True, mode="validation")
    schema: dict[str, Any] = _structural(raw, raw.get("$defs", {}))
    return schema


def build_crd() -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{api.PLURAL}.{api.GROUP}"},
        "spec": {
            "group": api.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": api.KIND,
                "listKind": f"{api.KIND}List",
                "plural": api.PLURAL,
                "singular": api.SINGULAR,
                "shortNames": api.SHORT_NAMES,
                "categories": ["all"],
            },
            "versions": [
                {
                    "name": api.VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": (
                                "A fine-tuning run that survives preemption and failures: one pod "
                                "per attempt, resumed from the newest verified checkpoint."
                            ),
                            "required": ["spec"],
                            "x-kubernetes-validations": [NAME_RULE],
                            "properties": {
                                "apiVersion": {"type": "string", "description": API_VERSION_DOC},
                                "kind": {"type": "string", "description": KIND_DOC},
                                # The API server rejects anything but the type here (not
                                # even a description); it publishes ObjectMeta's own docs.
                                "metadata": {"type": "object"},
                                "spec": spec_schema(),
                                "status": status_schema(),
                            },
                        }
                    },
                }
            ],
        },
    }


def render() -> str:
    header = "# Generated by `make crds` from operator/trainingrun/api.py. Do not edit.\n"
    return header + yaml.safe_dump(build_crd(), sort_keys=False, width=100)


if __name__ == "__main__":
    sys.stdout.write(render())
