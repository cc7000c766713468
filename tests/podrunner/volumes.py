"""A pod's volumes on the host, under ``<pod dir>/volumes/<volume>/``: emptyDir folders,
hostPath, and downwardAPI, secret, configMap and projected volumes written as the kubelet's
atomic writer writes them (downward API files are rewritten when labels or annotations change).

Secrets and ConfigMaps come from a ``lookup`` and service account tokens from a ``token``
callable, so nothing here talks to the API.
"""

from __future__ import annotations

import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.podrunner.spec import ConfigError, Lookup, downward_files, key_files, volume_kind

# (the serviceAccountToken source, the pod) -> a token bound to the pod
TokenSource = Callable[[dict[str, Any], dict[str, Any]], str]


def write_atomic(folder: Path, files: dict[str, str]) -> None:
    """Writes a volume's files the way the kubelet's atomic writer does: a fresh timestamped
    folder, the ``..data`` symlink swapped by rename, and one symlink per top-level name."""
    folder.mkdir(parents=True, exist_ok=True)
    fresh = folder / f"..{time.strftime('%Y_%m_%d_%H_%M_%S')}.{uuid.uuid4().hex[:8]}"
    fresh.mkdir()
    for rel, content in files.items():
        (fresh / rel).parent.mkdir(parents=True, exist_ok=True)
        (fresh / rel).write_text(content)
    tmp = folder / "..data_tmp"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(fresh.name)
    tmp.replace(folder / "..data")
    for top in {rel.split("/")[0] for rel in files}:
        link = folder / top
        if not link.is_symlink():
            link.symlink_to(f"..data/{top}")
    for old in folder.glob("..*_*"):
        if old.is_dir() and not old.is_symlink() and old.name != fresh.name:
            shutil.rmtree(old, ignore_errors=True)


class PodVolumes:
    """The volumes of one pod; ``dirs`` maps each volume name to its host folder."""

    def __init__(self, root: Path, namespace: str, lookup: Lookup, token: TokenSource) -> None:
        self.root = root
        self.namespace = namespace
        self.lookup = lookup
        self.token = token
        self.dirs: dict[str, Path] = {}
        self.downward: dict[str, dict[str, str]] = {}

    def prepare(self, pod: dict[str, Any]) -> None:
        """Puts every volume in place; raises ConfigError while one cannot be (retried)."""
        for v in pod["spec"].get("volumes") or []:
            kind = volume_kind(v)
            path = self.root / v["name"]
            if kind == "emptyDir":
                path.mkdir(parents=True, exist_ok=True)
            elif kind == "downwardAPI":
                files = downward_files(v, pod)
                write_atomic(path, files)
                self.downward[v["name"]] = files
            elif kind == "hostPath":
                path = Path(v["hostPath"]["path"])
                if v["hostPath"].get("type") == "DirectoryOrCreate":
                    path.mkdir(parents=True, exist_ok=True)
            elif kind == "projected":
                write_atomic(path, self._projected_files(v, pod))
            else:
                write_atomic(path, self._key_files(v[kind], kind))
            self.dirs[v["name"]] = path

    def refresh_downward(self, pod: dict[str, Any]) -> None:
        """Rewrites the downward API volumes whose content changed with the pod."""
        for v in pod["spec"].get("volumes") or []:
            if "downwardAPI" not in v:
                continue
            try:
                files = downward_files(v, pod)
            except ConfigError:
                continue
            if files != self.downward.get(v["name"]):
                write_atomic(self.dirs[v["name"]], files)
                self.downward[v["name"]] = files

    def _key_files(self, source: dict[str, Any], kind: str) -> dict[str, str]:
        """The files of a secret or configMap volume (or projected source)."""
        ref = source.get("secretName") or source.get("name") or ""
        data = self.lookup("Secret" if kind == "secret" else "ConfigMap", self.namespace, ref)
        if data is None and not source.get("optional"):
            raise ConfigError(f'{kind} "{ref}" not found')
        return key_files(source, data or {})

    def _projected_files(self, volume: dict[str, Any], pod: dict[str, Any]) -> dict[str, str]:
        """A projected volume (such as the service account's ``kube-api-access-*``); its token
        comes from the TokenRequest API, bound to the pod, as the kubelet gets it."""
        files: dict[str, str] = {}
        for source in volume["projected"].get("sources") or []:
            if "downwardAPI" in source:
                files.update(downward_files({"name": volume["name"], **source}, pod))
            elif "secret" in source or "configMap" in source:
                kind = "secret" if "secret" in source else "configMap"
                files.update(self._key_files(source[kind], kind))
            elif "serviceAccountToken" in source:
                files[source["serviceAccountToken"]["path"]] = self.token(
                    source["serviceAccountToken"], pod
                )
            else:
                raise ConfigError(f"volume {volume['name']}: projected source {list(source)}")
        return files
