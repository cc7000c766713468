"""The rules of the frameworks whose checkpoint is one file or one folder (HF Trainer, DCP,
Lightning, Composer, Accelerate): which files of the snapshot form its checkpoints, the step of
each, and whether it is whole. Each rule cites the framework source that writes the layout;
the facts are also tabled in docs/checkpoints.md ("Formats").
"""

from __future__ import annotations

import re
from collections import defaultdict

from trainingrun.checkpoint.layouts.base import (
    DCP_METADATA,
    FileInfo,
    Found,
    Proof,
    RuleResult,
    Snapshot,
    claim_folder,
    file_checkpoint,
    files_under,
    folder_checkpoint,
    folders,
    has,
    last_number,
    marker_for,
    name,
    parent,
    proof_of,
)

# -- HuggingFace Trainer ------------------------------------------------------------------------
# transformers Trainer._save_checkpoint: checkpoint-<global_step>/ at the top of output_dir;
# trainer_state.json is written after the model, optimizer and scheduler.
_HF = re.compile(r"^checkpoint-(\d+)$")
TRAINER_STATE = "trainer_state.json"


def hf(snapshot: Snapshot, contents: dict[str, str]) -> RuleResult:
    del contents
    found, claimed = [], set()
    for folder in {f.path.split("/", 1)[0] for f in snapshot if "/" in f.path}:
        m = _HF.match(folder)
        if not m:
            continue
        inside = files_under(snapshot, folder)
        claimed |= claim_folder(inside)
        has_state = has(inside, f"{folder}/{TRAINER_STATE}")
        proof = Proof.QUIET if has_state else Proof.INCOMPLETE
        found.append(folder_checkpoint("hf", inside, folder, int(m.group(1)), proof))
    return RuleResult(tuple(found), frozenset(claimed))


# -- torch.distributed.checkpoint ---------------------------------------------------------------
# torch/distributed/checkpoint/filesystem.py: every rank writes __<rank>_<n>.distcp in place;
# once all ranks' writes are gathered, the coordinator's FileSystemWriter.finish writes
# .metadata.tmp, fsyncs it and renames it to .metadata. A folder of .distcp files without
# .metadata is a save in flight or killed. dcp.load(checkpoint_id=<the folder>).
def _dcp_folders(snapshot: Snapshot) -> set[str]:
    return {
        parent(f.path)
        for f in snapshot
        if f.path.endswith(".distcp") or name(f.path) in (DCP_METADATA, DCP_METADATA + ".tmp")
    }


def dcp(snapshot: Snapshot, contents: dict[str, str]) -> RuleResult:
    del contents
    found, claimed = [], set()
    for folder in _dcp_folders(snapshot):
        inside = files_under(snapshot, folder)
        claimed |= claim_folder(inside)
        step = last_number(name(folder))
        if step is None:
            continue
        proof = proof_of(has(inside, f"{folder}/{DCP_METADATA}"))
        found.append(folder_checkpoint("dcp", inside, folder, step, proof))
    return RuleResult(tuple(found), frozenset(claimed))


# -- PyTorch Lightning --------------------------------------------------------------------------
# pytorch_lightning/callbacks/model_checkpoint.py: "<dirpath>/<filename>.ckpt"; the default
# filename "{epoch}-{step}" gives epoch=0-step=50.ckpt (step: trainer.global_step), versions add
# -v1. lightning_fabric/utilities/cloud_io.py _atomic_save writes through an fsspec transaction:
# a temporary file in the system temp folder, then shutil.move, which is a copy (not atomic)
# when that folder is on another file system: a file is whole once quiet, or marked by
# trainingrun.integrations.lightning. last.ckpt (a copy or a relative symlink) has no step:
# claimed, not a
# checkpoint of its own. Sharded strategies save a folder "<name>.ckpt/" in DCP form and rank 0
# writes meta.pt in it afterwards (strategies/fsdp.py).
_LIGHTNING_STEP = re.compile(r"(?:^|[-_])step=(\d+)")
LIGHTNING_SHARDED_META = "meta.pt"


def lightning_step(filename: str) -> int | None:
    """The step in a Lightning checkpoint's name (``epoch=0-step=50.ckpt`` -> 50), or None."""
    m = _LIGHTNING_STEP.search(filename)
    return int(m.group(1)) if m else None


def lightning(snapshot: Snapshot, contents: dict[str, str]) -> RuleResult:
    del contents
    found, claimed = [], set()
    for f in snapshot:
        if not f.path.endswith(".ckpt"):
            continue
        claimed.add(f.path)
        step = lightning_step(name(f.path))
        if step is not None and f.link is None:
            found.append(file_checkpoint("lightning", snapshot, f, step))
    for folder in folders(f.path for f in snapshot):
        if not folder.endswith(".ckpt"):
            continue
        inside = files_under(snapshot, folder)
        claimed |= claim_folder(inside)
        step = lightning_step(name(folder))
        if step is not None:
            whole = has(inside, f"{folder}/{DCP_METADATA}") and has(
                inside, f"{folder}/{LIGHTNING_SHARDED_META}"
            )
            found.append(folder_checkpoint("lightning", inside, folder, step, proof_of(whole)))
    return RuleResult(tuple(found), frozenset(claimed))


# -- Composer -----------------------------------------------------------------------------------
# CheckpointSaver: save_folder/ep{epoch}-ba{batch}-rank{rank}.pt, then the symlink
# latest-rank{rank}.pt is pointed at it once the file is written: a file the link names (or one
# older than the file it names) is whole. Sharded: ep{E}-ba{B}/ with __<rank>_0.distcp and
# .metadata, linked by latest-rank{rank}.pt -> the folder.
_COMPOSER = re.compile(r"^ep(\d+)-ba(\d+)(?:-rank(\d+))?(\.pt)?$")
_COMPOSER_LATEST = re.compile(r"^latest-rank(\d+)(\.pt)?$")


def _linked_batches(snapshot: Snapshot) -> dict[str, int]:
    """Folder -> the newest batch a latest-rank*.pt link in it points at."""
    out: dict[str, int] = {}
    for f in snapshot:
        if f.link is None or not _COMPOSER_LATEST.match(name(f.path)):
            continue
        m = _COMPOSER.match(name(f.link.rstrip("/")))
        if m:
            folder = parent(f.path)
            out[folder] = max(out.get(folder, -1), int(m.group(2)))
    return out


def composer(snapshot: Snapshot, contents: dict[str, str]) -> RuleResult:
    del contents
    linked = _linked_batches(snapshot)
    found, claimed = [], set()
    by_step: dict[tuple[str, int], list[FileInfo]] = defaultdict(list)
    for f in snapshot:
        if _COMPOSER_LATEST.match(name(f.path)) and f.link is not None:
            claimed.add(f.path)
        m = _COMPOSER.match(name(f.path))
        if m and m.group(4) and f.link is None:
            claimed.add(f.path)
            by_step[(parent(f.path), int(m.group(2)))].append(f)
    for (folder, batch), files in by_step.items():
        rank0 = min(files, key=lambda f: f.path)
        whole = linked.get(folder, -1) >= batch or has(snapshot, marker_for(rank0.path, False))
        found.append(
            Found(
                format="composer",
                step=batch,
                base=folder,
                files=tuple(sorted(name(f.path) for f in files)),
                resume=rank0.path,
                proof=proof_of(whole),
                newest_mtime=max(f.mtime for f in files),
                name=rank0.path,
            )
        )
    for folder in folders(f.path for f in snapshot):
        m = _COMPOSER.match(name(folder))
        if m and not m.group(4):
            inside = files_under(snapshot, folder)
            claimed |= claim_folder(inside)
            whole = has(inside, f"{folder}/{DCP_METADATA}") and linked.get(
                parent(folder), -1
            ) >= int(m.group(2))
            found.append(
                folder_checkpoint("composer", inside, folder, int(m.group(2)), proof_of(whole))
            )
    return RuleResult(tuple(found), frozenset(claimed))


# -- Accelerate ---------------------------------------------------------------------------------
# accelerate/accelerator.py save_state with automatic_checkpoint_naming: <project_dir>/
# checkpoints/checkpoint_<i>/ (i counts saves, not steps). checkpointing.py
# save_accelerator_state writes, in place and without a marker, the model, optimizer.bin,
# scheduler.bin, sampler.bin, scaler.pt, then random_states_<process>.pkl (custom_checkpoint_<n>
# .pkl after): a folder with random_states is whole once quiet. load_state(<the folder>).
_ACCELERATE = re.compile(r"^checkpoint_(\d+)$")
_ACCELERATE_LAST = re.compile(r"^random_states_\d+\.pkl$")


def accelerate(snapshot: Snapshot, contents: dict[str, str]) -> RuleResult:
    del contents
    found, claimed = [], set()
    for folder in folders(f.path for f in snapshot):
        m = _ACCELERATE.match(name(folder))
        if not m:
            continue
        inside = files_under(snapshot, folder)
        claimed |= claim_folder(inside)
        has_last = any(
            parent(f.path) == folder and _ACCELERATE_LAST.match(name(f.path)) for f in inside
        )
        proof = Proof.SETTLED if has_last else Proof.INCOMPLETE
        found.append(folder_checkpoint("accelerate", inside, folder, int(m.group(1)), proof))
    return RuleResult(tuple(found), frozenset(claimed))
