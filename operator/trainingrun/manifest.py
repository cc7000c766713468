"""The bucket manifest: the one record of which checkpoints are committed.

Layout under a run's prefix ``<uri>/<namespace>/<run>/``::

    manifest.json                                   RunManifest: committed entries, newest last
    checkpoints/checkpoint-<step>/MANIFEST.json     CheckpointManifest: files, sizes, checksums
    checkpoints/checkpoint-<step>/<files...>

The sync sidecar writes both (the per-checkpoint file create-only, ``manifest.json`` by
compare-and-swap); the operator and the restore only read them. This module is pure: parsing,
validation and the choice of candidates, with no storage client.
"""

from __future__ import annotations

import json
import posixpath
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

MANIFEST_VERSION = 1
RUN_MANIFEST = "manifest.json"
CHECKPOINT_MANIFEST = "MANIFEST.json"
CHECKPOINTS_DIR = "checkpoints"


class ManifestError(ValueError):
    """A manifest that cannot be trusted; the message names the problem and the fix."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


def checkpoint_dirname(step: int) -> str:
    return f"checkpoint-{step}"


def checkpoint_prefix(step: int) -> str:
    """Key of a checkpoint's folder relative to the run prefix, ending with '/'."""
    return f"{CHECKPOINTS_DIR}/{checkpoint_dirname(step)}/"


def safe_relative_path(path: str) -> str:
    """Returns ``path`` normalised, or raises when it could escape the checkpoint folder."""
    if not path or "\\" in path or "\x00" in path:
        raise ManifestError(f"file name {path!r} is empty or has a backslash or NUL")
    if path.startswith("/"):
        raise ManifestError(f"file name {path!r} is absolute; names must be relative")
    parts = path.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise ManifestError(f"file name {path!r} has an empty, '.' or '..' part")
    normal = posixpath.normpath(path)
    if normal != path:
        raise ManifestError(f"file name {path!r} is not in normal form")
    return path


class FileEntry(_Model):
    path: str = Field(description="Path relative to the checkpoint folder.")
    size: int = Field(ge=0)
    checksum_algorithm: str = Field(description="CRC64NVME, CRC32C, CRC32 or SHA256.")
    checksum: str = Field(description="Base64 of the full-object checksum.")

    @field_validator("path")
    @classmethod
    def _safe(cls, v: str) -> str:
        return safe_relative_path(v)


class CheckpointManifest(_Model):
    """``checkpoint-<step>/MANIFEST.json``: what a complete checkpoint consists of."""

    version: int
    step: int = Field(ge=0)
    files: list[FileEntry]
    created: str

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)


class ManifestEntry(_Model):
    step: int = Field(ge=0)
    prefix: str
    committed: str = Field(description="Commit time, RFC 3339.")
    files: int = Field(ge=0)
    bytes: int = Field(ge=0)


class RunManifest(_Model):
    """``manifest.json``: committed checkpoints in commit order; ``latest`` is the newest step."""

    version: int = MANIFEST_VERSION
    entries: list[ManifestEntry] = Field(default_factory=list)

    @property
    def latest(self) -> ManifestEntry | None:
        return max(self.entries, key=lambda e: e.step) if self.entries else None

    def to_json(self) -> bytes:
        body = {"version": self.version, "entries": [e.model_dump() for e in self.entries]}
        latest = self.latest
        body["latest"] = latest.step if latest else None
        return json.dumps(body, indent=1, sort_keys=True).encode()


def _parse(model: type[_Model], data: bytes, what: str) -> Any:
    try:
        raw = json.loads(data)
    # ValueError also covers integers past Python's digit limit; RecursionError, deep nesting.
    except (ValueError, RecursionError) as e:
        raise ManifestError(f"{what} is not valid JSON ({e}); it was not written by sync") from e
    if not isinstance(raw, dict):
        raise ManifestError(f"{what} must be a JSON object, got {type(raw).__name__}")
    version = raw.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ManifestError(f"{what} has no positive integer 'version'")
    if version > MANIFEST_VERSION:
        raise ManifestError(
            f"{what} has version {version}, newer than the {MANIFEST_VERSION} this build reads: "
            "upgrade the operator and agent images"
        )
    try:
        return model.model_validate(raw)
    except ValidationError as e:
        raise ManifestError(
            f"{what} is malformed: {e.errors()[0]['msg']} at {e.errors()[0]['loc']}"
        ) from e


def parse_run_manifest(data: bytes) -> RunManifest:
    manifest: RunManifest = _parse(RunManifest, data, RUN_MANIFEST)
    steps = [e.step for e in manifest.entries]
    if len(steps) != len(set(steps)):
        raise ManifestError(f"{RUN_MANIFEST} names a step twice: {sorted(steps)}")
    for e in manifest.entries:
        if e.prefix != checkpoint_prefix(e.step):
            raise ManifestError(
                f"{RUN_MANIFEST} entry for step {e.step} has prefix {e.prefix!r}, "
                f"expected {checkpoint_prefix(e.step)!r}"
            )
    return manifest


def parse_checkpoint_manifest(data: bytes, step: int) -> CheckpointManifest:
    what = checkpoint_prefix(step) + CHECKPOINT_MANIFEST
    manifest: CheckpointManifest = _parse(CheckpointManifest, data, what)
    if manifest.step != step:
        raise ManifestError(f"{what} says step {manifest.step}, expected {step}")
    paths = [f.path for f in manifest.files]
    if len(paths) != len(set(paths)):
        raise ManifestError(f"{what} lists a file twice")
    if CHECKPOINT_MANIFEST in paths:
        raise ManifestError(f"{what} lists itself")
    return manifest


def candidates(manifest: RunManifest, bad_steps: set[int] | frozenset[int]) -> list[ManifestEntry]:
    """Committed entries to try, newest first, skipping steps recorded as bad."""
    return sorted(
        (e for e in manifest.entries if e.step not in bad_steps),
        key=lambda e: e.step,
        reverse=True,
    )


def listing_problems(checkpoint: CheckpointManifest, listing: dict[str, int]) -> list[str]:
    """What is wrong with a checkpoint's objects (relative path -> size) against its manifest."""
    problems = []
    for f in checkpoint.files:
        size = listing.get(f.path)
        if size is None:
            problems.append(f"{f.path} is missing")
        elif size != f.size:
            problems.append(f"{f.path} has {size} bytes, manifest says {f.size}")
    return problems


def with_committed(
    manifest: RunManifest | None, entry: ManifestEntry, keep: int
) -> tuple[RunManifest, list[ManifestEntry]]:
    """The manifest after committing ``entry`` and keeping the newest ``keep`` steps, and the
    entries retention dropped (their objects may be deleted once the new manifest is written).
    Committing a step that is already there replaces its entry."""
    if keep < 1:
        raise ValueError(f"keep must be at least 1, got {keep}")
    entries = [e for e in (manifest.entries if manifest else []) if e.step != entry.step]
    entries.append(entry)
    entries.sort(key=lambda e: e.step)
    kept, dropped = entries[-keep:], entries[:-keep]
    version = manifest.version if manifest else MANIFEST_VERSION
    return RunManifest(version=version, entries=kept), dropped


def worth_uploading(step: int, committed: list[int], keep: int) -> bool:
    """False for a step retention would drop at once: ``keep`` newer steps are committed."""
    return step not in committed and sum(1 for s in committed if s > step) < keep


def same_files(a: CheckpointManifest, b: CheckpointManifest) -> bool:
    """Both describe the same bytes (creation time aside)."""

    def key(m: CheckpointManifest) -> list[tuple[str, int, str, str]]:
        return sorted((f.path, f.size, f.checksum_algorithm, f.checksum) for f in m.files)

    return a.step == b.step and key(a) == key(b)
