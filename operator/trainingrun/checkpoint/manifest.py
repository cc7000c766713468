"""The bucket manifest: the one record of which checkpoints are committed.

Layout under a run's prefix ``<uri>/<namespace>/<run>/`` (version 2)::

    manifest.json                                RunManifest: the fence, committed entries
    checkpoints/checkpoint-<step>/e<epoch>/r<rank>/MANIFEST.json
                                                 CheckpointManifest of one rank's part: files,
                                                 sizes, checksums
    checkpoints/checkpoint-<step>/e<epoch>/r<rank>/<files...>

The epoch is the fence an attempt holds (``trainingrun.checkpoint.protocol``): every attempt writes
under
keys of its own, so no write of one attempt can change an object another one committed. A
version-1 bucket has ``checkpoints/checkpoint-<step>/MANIFEST.json`` and the files beside it; its
entries read as epoch 0 with one rank and keep that layout (``part_prefixes``).

This module is pure: the models, parsing, validation, key layout and the choice of candidates,
with no storage client.

Every reader caps what it decodes (``trainingrun.checkpoint.capped``: bytes, checkpoints, files,
ranks):
the operator reads every tenant's manifests, which anyone with write access to a bucket can
make. File names reach Events and the CLI: they must be printable and at most
``MAX_NAME_BYTES`` long.
"""

from __future__ import annotations

import functools
import json
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator

from trainingrun.checkpoint.capped import (
    CHECKPOINT_MANIFEST_MAX_BYTES,
    MAX_CHECKPOINT_FILES,
    MAX_CHECKPOINT_RECORD_BYTES,
    MAX_ENTRIES,
    MAX_FILES,
    MAX_NAME_BYTES,
    MAX_RANKS,
    RUN_MANIFEST,
    RUN_MANIFEST_MAX_BYTES,
    VALUES_PER_ENTRY,
    VALUES_PER_FILE,
    Caps,
    ManifestError,
    ManifestTooLarge,
    decode,
    too_large,
)

# The caps and errors every reader of a manifest uses, named here as before they had a module.
from trainingrun.contract import checkpoint_dirname

__all__ = [
    "CHECKPOINT_MANIFEST_MAX_BYTES",
    "MAX_CHECKPOINT_FILES",
    "MAX_CHECKPOINT_RECORD_BYTES",
    "MAX_ENTRIES",
    "MAX_FILES",
    "MAX_NAME_BYTES",
    "MAX_RANKS",
    "RUN_MANIFEST",
    "RUN_MANIFEST_MAX_BYTES",
    "ManifestError",
    "ManifestTooLarge",
    "too_large",
]

MANIFEST_VERSION = 2
# A part whose small files are packed (``pack`` on its files) is version 3, so a reader from
# before packs refuses it by name instead of looking for objects that are not there.
PACKED_VERSION = 3
CHECKPOINT_MANIFEST = "MANIFEST.json"
CHECKPOINTS_DIR = "checkpoints"
# Where a part's packs go, beside its files: objects holding many small files back to back
# (``trainingrun.agent.packs``). No checkpoint file of a packed part is under it.
PACK_DIR = ".trainingrun-packs"


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


def _at_most_max_ranks(ranks: int) -> int:
    if ranks > MAX_RANKS:
        raise ValueError(
            f"ranks is {ranks}; a checkpoint has at most {MAX_RANKS} (the most spec.replicas "
            "allows), so the sync sidecar did not write it"
        )
    return ranks


# Checked before anything is built per rank.
Ranks = Annotated[int, Field(ge=1), AfterValidator(_at_most_max_ranks)]


def checkpoint_prefix(step: int) -> str:
    """Key of a checkpoint's folder relative to the run prefix, ending with '/'; in a version-1
    bucket, where its files are."""
    return f"{CHECKPOINTS_DIR}/{checkpoint_dirname(step)}/"


def epoch_prefix(step: int, epoch: int) -> str:
    """The folder of the parts an attempt holding ``epoch`` wrote of ``step``; version-1
    (epoch 0) entries use the checkpoint's folder itself."""
    return checkpoint_prefix(step) + (f"e{epoch}/" if epoch else "")


def part_prefix(step: int, epoch: int, rank: int) -> str:
    """The folder of one rank's files and its MANIFEST.json, ending with '/'."""
    if not epoch:
        if rank:
            raise ValueError("a version-1 checkpoint has one part, rank 0")
        return checkpoint_prefix(step)
    return f"{epoch_prefix(step, epoch)}r{rank}/"


_NOT_A_PART = frozenset(("", ".", ".."))


def safe_relative_path(path: str) -> str:
    """Returns ``path`` normalised, or raises when it could escape the checkpoint folder, is
    not printable or is longer than MAX_NAME_BYTES. A relative path with no empty, '.' or '..'
    part is its own normal form: every check is a C-level scan, as a part record's parse runs
    it for each of up to MAX_FILES names."""
    size = len(path.encode("utf-8", "surrogatepass"))
    if size > MAX_NAME_BYTES:
        raise ManifestError(
            f"file name {path[:64]!r}... is {size} bytes, over {MAX_NAME_BYTES}: use a shorter one"
        )
    if not path or "\\" in path or "\x00" in path:
        raise ManifestError(f"file name {path!r} is empty or has a backslash or NUL")
    if not path.isprintable():  # control and format characters would garble logs and Events
        raise ManifestError(f"file name {path!r} has a character that is not printable: rename it")
    if path[0] == "/":
        raise ManifestError(f"file name {path!r} is absolute; names must be relative")
    if not _NOT_A_PART.isdisjoint(path.split("/")):
        raise ManifestError(f"file name {path!r} has an empty, '.' or '..' part")
    return path


@functools.lru_cache(maxsize=64)
def _pack_name(name: str) -> str:
    """``name`` when it is a safe name under PACK_DIR; remembered, as the many files of a pack
    all name it."""
    if not is_pack_name(safe_relative_path(name)):
        raise ValueError(f"pack {name!r} is not a name under {PACK_DIR}/")
    return name


class FileEntry(_Model):
    path: str = Field(description="Path relative to the checkpoint folder.")
    size: int = Field(ge=0)
    checksum_algorithm: str = Field(description="CRC64NVME, CRC32C, CRC32 or SHA256.")
    checksum: str = Field(description="Base64 of the full-object checksum.")
    pack: str | None = Field(
        default=None, description="The pack holding its bytes (under PACK_DIR); None: its own."
    )
    offset: int = Field(default=0, ge=0, description="Where its bytes start in the pack.")

    @field_validator("path")
    @classmethod
    def _safe(cls, v: str) -> str:
        return safe_relative_path(v)

    @field_validator("pack")
    @classmethod
    def _pack(cls, v: str | None) -> str | None:
        return None if v is None else _pack_name(v)

    @property
    def source(self) -> str:
        """The object holding its bytes, relative to its part's folder."""
        return self.pack if self.pack is not None else self.path


def is_pack_name(path: str) -> bool:
    return path.startswith(PACK_DIR + "/")


MAX_EXTRAS = 64
MAX_EXTRA_BYTES = 64 * 1024


class Layout(_Model):
    """Where a checkpoint goes on local disk, for layouts other than the HuggingFace Trainer's
    ``checkpoint-<step>/`` (no layout recorded): the files' paths are relative to ``base``, the
    trainer resumes from ``resume`` (both relative to the checkpoint folder, "" for the folder
    itself), and ``extras`` are small files the restore writes under ``base`` (a framework's
    pointer to its newest checkpoint, such as DeepSpeed's ``latest``)."""

    format: str = Field(max_length=64)
    base: str = Field(default="", max_length=1024)
    resume: str = Field(default="", max_length=1024)
    extras: dict[str, str] = Field(default_factory=dict)

    @field_validator("base", "resume")
    @classmethod
    def _folder(cls, v: str) -> str:
        return safe_relative_path(v) if v else v

    @field_validator("extras")
    @classmethod
    def _extras(cls, v: dict[str, str]) -> dict[str, str]:
        if len(v) > MAX_EXTRAS or sum(len(t) for t in v.values()) > MAX_EXTRA_BYTES:
            raise ValueError(f"at most {MAX_EXTRAS} extra files of {MAX_EXTRA_BYTES} bytes")
        for path in v:
            safe_relative_path(path)
        return v

    @staticmethod
    def folder(layout: Layout | None, step: int) -> str:
        """The folder (relative to the checkpoint folder) a checkpoint's files go under."""
        return checkpoint_dirname(step) if layout is None else layout.base

    @staticmethod
    def resume_path(layout: Layout | None, step: int) -> str:
        """What the trainer resumes from, relative to the checkpoint folder."""
        return checkpoint_dirname(step) if layout is None else layout.resume


class CheckpointManifest(_Model):
    """A part's ``MANIFEST.json``: what one rank's share of a checkpoint consists of (with one
    rank, the whole checkpoint). Version-1 files have no epoch or rank: 0, of 1."""

    version: int
    step: int = Field(ge=0)
    files: list[FileEntry]
    created: str
    epoch: int = Field(default=0, ge=0)
    attempt: int = Field(default=0, ge=0)
    rank: int = Field(default=0, ge=0, lt=MAX_RANKS)
    ranks: Ranks = 1
    layout: Layout | None = Field(default=None, description="None: checkpoint-<step>/.")
    upload_seconds: float | None = Field(
        default=None, ge=0, description="What this rank's upload and verify took, if measured."
    )

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)


class ManifestEntry(_Model):
    step: int = Field(ge=0)
    prefix: str = Field(description="epoch_prefix(step, epoch): where the parts are.")
    committed: str = Field(description="Commit time, RFC 3339.")
    files: int = Field(ge=0)
    bytes: int = Field(ge=0)
    epoch: int = Field(default=0, ge=0, description="The fence it was committed under.")
    attempt: int = Field(default=0, ge=0, description="The attempt that wrote it, if known.")
    ranks: Ranks = Field(default=1, description="How many parts it has.")
    layout: Layout | None = Field(default=None, description="None: checkpoint-<step>/.")
    upload_seconds: float | None = Field(
        default=None,
        ge=0,
        description="The slowest rank's upload and verify (None: a part did not say): what "
        "a save of this size takes to upload.",
    )

    @property
    def part_prefixes(self) -> list[str]:
        """The folders of its parts, rank by rank, relative to the run prefix."""
        return [part_prefix(self.step, self.epoch, r) for r in range(self.ranks)]


class RunManifest(_Model):
    """``manifest.json``: the fence (the epoch allowed to commit, and who holds it) and the
    committed checkpoints in commit order; ``latest`` is the newest step."""

    version: int = MANIFEST_VERSION
    fence: int = Field(default=0, ge=0)
    fence_holder: str = ""
    entries: list[ManifestEntry] = Field(default_factory=list)

    @property
    def latest(self) -> ManifestEntry | None:
        return max(self.entries, key=lambda e: e.step) if self.entries else None

    def to_json(self) -> bytes:
        body: dict[str, Any] = {
            "version": self.version,
            "fence": self.fence,
            "fence_holder": self.fence_holder,
            "entries": [e.model_dump() for e in self.entries],
        }
        latest = self.latest
        body["latest"] = latest.step if latest else None
        return json.dumps(body, indent=1, sort_keys=True).encode()


_RUN_CAPS = Caps(
    RUN_MANIFEST_MAX_BYTES,
    "entries",
    "checkpoints",
    MAX_ENTRIES,
    VALUES_PER_ENTRY,
    MANIFEST_VERSION,
)
_PART_CAPS = Caps(
    CHECKPOINT_MANIFEST_MAX_BYTES, "files", "files", MAX_FILES, VALUES_PER_FILE, PACKED_VERSION
)


def _parse(model: type[_Model], data: bytes, what: str, caps: Caps) -> Any:
    raw = decode(data, what, caps)
    try:
        return model.model_validate(raw)
    except ValidationError as e:
        raise ManifestError(
            f"{what} is malformed: {e.errors()[0]['msg']} at {e.errors()[0]['loc']}"
        ) from e


def parse_run_manifest(data: bytes) -> RunManifest:
    manifest: RunManifest = _parse(RunManifest, data, RUN_MANIFEST, _RUN_CAPS)
    steps = [e.step for e in manifest.entries]
    if len(steps) != len(set(steps)):
        raise ManifestError(f"{RUN_MANIFEST} names a step twice: {sorted(steps)}")
    for e in manifest.entries:
        if e.prefix != epoch_prefix(e.step, e.epoch):
            raise ManifestError(
                f"{RUN_MANIFEST} entry for step {e.step} has prefix {e.prefix!r}, "
                f"expected {epoch_prefix(e.step, e.epoch)!r}"
            )
        if e.epoch > manifest.fence or (not e.epoch and e.ranks != 1):
            raise ManifestError(
                f"{RUN_MANIFEST} entry for step {e.step} has epoch {e.epoch} and {e.ranks} "
                f"ranks, which its fence {manifest.fence} cannot have let in"
            )
    return manifest


def parse_checkpoint_manifest(
    data: bytes, step: int, epoch: int = 0, rank: int = 0
) -> CheckpointManifest:
    try:
        what = part_prefix(step, epoch, rank) + CHECKPOINT_MANIFEST
    except ValueError as e:
        raise ManifestError(str(e)) from e
    manifest: CheckpointManifest = _parse(CheckpointManifest, data, what, _PART_CAPS)
    if (manifest.step, manifest.epoch, manifest.rank) != (step, epoch, rank):
        raise ManifestError(
            f"{what} says step {manifest.step}, epoch {manifest.epoch}, rank {manifest.rank}; "
            f"expected {step}, {epoch}, {rank}"
        )
    paths = [f.path for f in manifest.files]
    if len(paths) != len(set(paths)):
        raise ManifestError(f"{what} lists a file twice")
    if CHECKPOINT_MANIFEST in paths:
        raise ManifestError(f"{what} lists itself")
    _check_packs(what, manifest)
    return manifest


def _check_packs(what: str, manifest: CheckpointManifest) -> None:
    """Refuses packs a restore could not split: a pack whose files do not lie back to back
    from its start, a packed file in a part older than PACKED_VERSION, or a file of the part
    under PACK_DIR (where its packs are)."""
    packs: dict[str, list[FileEntry]] = {}
    for f in manifest.files:
        if is_pack_name(f.path):
            raise ManifestError(f"{what} lists {f.path}, under {PACK_DIR}/ where packs go")
        if f.pack is not None:
            packs.setdefault(f.pack, []).append(f)
    if packs and manifest.version < PACKED_VERSION:
        raise ManifestError(f"{what} has packed files but version {manifest.version}")
    for pack, members in packs.items():
        at = 0
        for f in sorted(members, key=lambda m: m.offset):
            if f.offset != at:
                raise ManifestError(f"{what}: {pack} does not hold its files back to back")
            at += f.size


def listing_problems(checkpoint: CheckpointManifest, listing: dict[str, int]) -> list[str]:
    """What is wrong with a checkpoint's objects (relative path -> size) against its manifest."""
    problems = []
    for f in checkpoint.files:
        size = listing.get(f.source)
        what = f.path if f.pack is None else f"{f.path} (in {f.pack})"
        if size is None:
            problems.append(f"{what} is missing")
        elif f.pack is None and size != f.size:
            problems.append(f"{what} has {size} bytes, manifest says {f.size}")
        elif size < f.offset + f.size:
            problems.append(f"{f.pack} has {size} bytes, too few to hold {f.path}")
    return problems


def slowest(seconds: list[float | None]) -> float | None:
    """The upload time of a checkpoint from its parts': the slowest rank's, None when a part
    did not measure it (written by an older sidecar)."""
    known = [s for s in seconds if s is not None]
    return max(known) if known and len(known) == len(seconds) else None
