"""What a container of a pod spec turns into on this machine, as plain functions of the pod dict:
its environment (``value``, ``valueFrom`` and ``envFrom``, with ``$(VAR)`` expansion), its
command line, its volume mounts, downward API file contents and its termination message.

Secrets and ConfigMaps come from a ``lookup(kind, namespace, name)`` callable, so nothing here
talks to the API.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.podrunner.process import Mount

REPO = Path(__file__).resolve().parents[2]
# The venv first, so ``trainingrun sync`` and ``python`` are the project's.
DEFAULT_PATH = (
    f"{REPO / '.venv' / 'bin'}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
)
DEFAULT_TERMINATION_PATH = "/dev/termination-log"
POD_IP = "127.0.0.1"
# Kubelet limits (pkg/kubelet/container): 4 KiB per message, 80 lines / 2 KiB from the log.
MAX_MESSAGE_BYTES = 4096
FALLBACK_LOG_LINES = 80
FALLBACK_LOG_BYTES = 2048

Lookup = Callable[[str, str, str], dict[str, str] | None]


class ConfigError(Exception):
    """The container cannot be configured yet (missing Secret or key, unsupported field);
    reported as ``CreateContainerConfigError`` and retried, as the kubelet does."""


def is_sidecar(container: dict[str, Any]) -> bool:
    """A native sidecar: an init container with ``restartPolicy: Always``."""
    return container.get("restartPolicy") == "Always"


_EXPAND = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.\-]*)\)")


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes ``$(VAR)`` expansion: defined names are replaced, ``$$`` escapes, the rest
    stays as written."""

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1)
        return env.get(name, m.group(0))

    return _EXPAND.sub(sub, text)


def _selector(path: str, prefix: str) -> str | None:
    m = re.fullmatch(rf"{re.escape(prefix)}\['(.+)'\]", path)
    return m.group(1) if m else None


def format_map(values: dict[str, str]) -> str:
    """The kubelet's downward API format for labels and annotations: ``key="escaped"`` lines,
    sorted by key."""
    return "\n".join(f"{k}={json.dumps(values[k], ensure_ascii=False)}" for k in sorted(values))


def pod_hostname(pod: dict[str, Any]) -> str:
    """The pod's host name: ``spec.hostname``, else its name, as the kubelet sets it."""
    return str((pod.get("spec") or {}).get("hostname") or pod["metadata"]["name"])


def field_value(pod: dict[str, Any], path: str, pod_ip: str = POD_IP) -> str:
    """The value of a ``fieldRef.fieldPath`` (env and downward API volumes); ``pod_ip`` is the
    pod's address (its own with a network of its own, else the node's loopback)."""
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    labels = meta.get("labels") or {}
    simple = {
        "metadata.name": meta.get("name", ""),
        "metadata.namespace": meta.get("namespace", ""),
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": (pod.get("spec") or {}).get("nodeName", ""),
        "spec.serviceAccountName": (pod.get("spec") or {}).get("serviceAccountName", ""),
        "status.podIP": pod_ip,
        "status.hostIP": POD_IP,
    }
    if path in simple:
        return str(simple[path])
    if path == "metadata.annotations":
        return format_map(annotations)
    if path == "metadata.labels":
        return format_map(labels)
    if (key := _selector(path, "metadata.annotations")) is not None:
        return str(annotations.get(key, ""))
    if (key := _selector(path, "metadata.labels")) is not None:
        return str(labels.get(key, ""))
    raise ConfigError(f"fieldRef {path!r} is not supported by the local pod runner")


def _key_ref(ref: dict[str, Any], kind: str, namespace: str, lookup: Lookup) -> str | None:
    data = lookup(kind, namespace, ref["name"])
    optional = bool(ref.get("optional"))
    if data is None:
        if optional:
            return None
        raise ConfigError(f'{kind.lower()} "{ref["name"]}" not found')
    if ref["key"] not in data:
        if optional:
            return None
        raise ConfigError(f"couldn't find key {ref['key']} in {kind} {namespace}/{ref['name']}")
    return data[ref["key"]]


def container_env(
    pod: dict[str, Any], container: dict[str, Any], lookup: Lookup, pod_ip: str = POD_IP
) -> dict[str, str]:
    """The process environment of ``container``: a base (PATH with the venv, HOSTNAME, HOME),
    then ``envFrom``, then ``env`` in order, each value expanded against what came before."""
    namespace = pod["metadata"]["namespace"]
    env: dict[str, str] = {
        "PATH": DEFAULT_PATH,
        "HOSTNAME": pod_hostname(pod),
        "HOME": "/root",
    }
    for source in container.get("envFrom") or []:
        prefix = source.get("prefix", "")
        for kind, key in (("Secret", "secretRef"), ("ConfigMap", "configMapRef")):
            if key not in source:
                continue
            ref = source[key]
            data = lookup(kind, namespace, ref["name"])
            if data is None:
                if ref.get("optional"):
                    continue
                raise ConfigError(f'{kind.lower()} "{ref["name"]}" not found')
            env.update({prefix + k: v for k, v in data.items()})
    for item in container.get("env") or []:
        name = item["name"]
        if "valueFrom" not in item:
            env[name] = expand(item.get("value") or "", env)
            continue
        source = item["valueFrom"]
        value: str | None
        if "secretKeyRef" in source:
            value = _key_ref(source["secretKeyRef"], "Secret", namespace, lookup)
        elif "configMapKeyRef" in source:
            value = _key_ref(source["configMapKeyRef"], "ConfigMap", namespace, lookup)
        elif "fieldRef" in source:
            value = field_value(pod, source["fieldRef"]["fieldPath"], pod_ip)
        else:
            raise ConfigError(f"env {name}: only value, secretKeyRef, configMapKeyRef and fieldRef")
        if value is not None:
            env[name] = value
    return env


def command_line(container: dict[str, Any], env: dict[str, str]) -> list[str]:
    """``command`` + ``args`` with ``$(VAR)`` expanded. Images are not run, so a container
    without either cannot start."""
    argv = [*(container.get("command") or []), *(container.get("args") or [])]
    if not argv:
        raise ValueError(
            f"container {container['name']} has no command or args: the local pod runner runs "
            "them as local processes and ignores the image; give the container a command"
        )
    return [expand(a, env) for a in argv]


def volume_kind(volume: dict[str, Any]) -> str:
    for kind in ("emptyDir", "downwardAPI", "secret", "configMap", "hostPath", "projected"):
        if kind in volume:
            return kind
    other = next((k for k in volume if k != "name"), "?")
    raise ConfigError(
        f"volume {volume['name']}: {other} is not supported by the local pod runner "
        "(emptyDir, downwardAPI, secret, configMap, hostPath, projected)"
    )


def mounts_of(
    container: dict[str, Any], volume_dirs: dict[str, Path], termination_file: Path
) -> list[Mount]:
    """The container's bind mounts: each ``volumeMount`` (with ``subPath``), and its own
    termination message file at ``terminationMessagePath``."""
    mounts = []
    for vm in container.get("volumeMounts") or []:
        if vm["name"] not in volume_dirs:
            raise ConfigError(f"volumeMount {vm['name']}: no volume of that name in the pod")
        source = volume_dirs[vm["name"]]
        if vm.get("subPath"):
            source = source / vm["subPath"]
            if not source.exists():
                source.mkdir(parents=True)
        mounts.append(
            Mount(
                source=source,
                target=vm["mountPath"],
                read_only=bool(vm.get("readOnly")),
                is_file=source.is_file(),
            )
        )
    target = container.get("terminationMessagePath") or DEFAULT_TERMINATION_PATH
    mounts.append(Mount(source=termination_file, target=target, is_file=True))
    return mounts


def downward_files(volume: dict[str, Any], pod: dict[str, Any]) -> dict[str, str]:
    """The files of a downwardAPI volume: relative path → content."""
    files = {}
    for item in volume["downwardAPI"].get("items") or []:
        if "fieldRef" not in item:
            raise ConfigError(f"volume {volume['name']}: only fieldRef items are supported")
        files[item["path"]] = field_value(pod, item["fieldRef"]["fieldPath"])
    return files


def key_files(source: dict[str, Any], data: dict[str, str]) -> dict[str, str]:
    """The files of a secret or configMap source: every key, or the listed ``items``."""
    items = source.get("items")
    if not items:
        return dict(data)
    return {i["path"]: data[i["key"]] for i in items if i["key"] in data}


def termination_message(
    container: dict[str, Any], message_file: Path, log_file: Path, code: int
) -> str:
    """The kubelet's rule: the message file's content; with ``FallbackToLogsOnError``, the end
    of the log when the file is empty and the container failed."""
    message = ""
    with_file = message_file.exists()
    if with_file:
        message = message_file.read_bytes()[:MAX_MESSAGE_BYTES].decode(errors="replace")
    fallback = container.get("terminationMessagePolicy") == "FallbackToLogsOnError"
    if not message and fallback and code != 0 and log_file.exists():
        lines = log_file.read_bytes().splitlines()[-FALLBACK_LOG_LINES:]
        message = b"\n".join(lines)[-FALLBACK_LOG_BYTES:].decode(errors="replace")
    return message
