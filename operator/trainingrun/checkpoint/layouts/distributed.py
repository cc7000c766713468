"""The rules of the frameworks that save one checkpoint from many ranks into a shared folder
(DeepSpeed, Megatron-LM, NeMo 2, MindFormers), where the proof of a whole checkpoint is a file
one rank writes after the others finished. The facts are tabled in docs/checkpoints.md
("Formats").
"""

from __future__ import annotations

import dataclasses
import json
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
    files_under,
    folder_checkpoint,
    folders,
    has,
    last_number,
    name,
    parent,
    proof_of,
    relative,
    text,
    under,
)

# -- DeepSpeed ----------------------------------------------------------------------------------
# deepspeed/runtime/engine.py save_checkpoint(save_dir, tag="global_step{N}"): every rank
# torch.saves its files in place into save_dir/<tag>/ (mp_rank_XX_model_states.pt;
# [bf16_]zero_pp_rank_<dp>_mp_rank_XX_optim_states.pt per rank under ZeRO, and
# zero_pp_rank_<dp>_mp_rank_XX_model_states.pt under ZeRO-3; layer_XX[-model_XX]-model_states.pt
# under pipeline parallelism; MoE expert files); then global rank 0 writes save_dir/latest (the
# tag) BEFORE the closing barrier, so "latest" alone does not prove the other ranks finished: a
# tag is whole once a newer save has begun, or its shards are unbroken and as many as an older
# whole tag's and nothing changed for the quiet period. zero_to_fp32.py and zero_to_torch.py are
# copied into save_dir. load_checkpoint(save_dir) reads latest.
_DS_FILE = re.compile(r"^.+[_-](?:model|optim)_states\.pt$")
_DS_OPTIM = re.compile(r"^(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt$")
DS_LATEST = "latest"
DS_SCRIPTS = ("zero_to_fp32.py", "zero_to_torch.py")


def _shard_ranks(inside: Snapshot, folder: str) -> dict[int, set[int]]:
    """model-parallel rank -> the data-parallel ranks whose optimizer shard is in ``folder``
    (``inside``: the files under it)."""
    out: dict[int, set[int]] = defaultdict(set)
    for f in inside:
        m = _DS_OPTIM.match(name(f.path))
        if m and parent(f.path) == folder:
            out[int(m.group(2))].add(int(m.group(1)))
    return out


def _shards_whole(ranks: dict[int, set[int]], reference: dict[int, set[int]] | None) -> bool:
    """Every model-parallel rank has an unbroken run of data-parallel shards, as many as an
    older whole tag of the same run had (a gang's pod holds only its own ranks' shards)."""
    if any(max(dps) - min(dps) + 1 != len(dps) for dps in ranks.values()):
        return False
    if reference is None:
        return True
    return {k: len(v) for k, v in ranks.items()} == {k: len(v) for k, v in reference.items()}


def _deepspeed_proof(step: int, newer: bool, latest: int | None, shards_ok: bool) -> Proof:
    """A newer tag's folder means training went on past this save's closing barrier; the
    newest tag is whole once ``latest`` names it and nothing changed for the quiet period
    (``latest`` is rewritten in place, so a torn one names nothing)."""
    if not shards_ok:
        return Proof.INCOMPLETE
    if newer:
        return Proof.COMPLETE
    return Proof.SETTLED if latest == step else Proof.INCOMPLETE


def deepspeed(snapshot: Snapshot, contents: dict[str, str]) -> RuleResult:
    tags = {parent(f.path) for f in snapshot if "/" in f.path and _DS_FILE.match(name(f.path))}
    by_save_dir: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for tag in tags:
        step = last_number(name(tag))
        if step is not None:
            by_save_dir[parent(tag)].append((step, tag))
    found, claimed = [], set()
    for save_dir, dir_tags in by_save_dir.items():
        prefix = f"{save_dir}/" if save_dir else ""
        claimed |= {prefix + n for n in (DS_LATEST, *DS_SCRIPTS)}
        named = text(contents, prefix + DS_LATEST)
        latest = next((s for s, t in dir_tags if named is not None and name(t) == named), None)
        reference = None
        newest = max(s for s, _ in dir_tags)
        for step, tag in sorted(dir_tags):
            inside = files_under(snapshot, tag)
            claimed |= claim_folder(inside)
            ranks = _shard_ranks(inside, tag)
            shards_ok = not ranks or _shards_whole(ranks, reference)
            proof = _deepspeed_proof(step, step < newest, latest, shards_ok)
            if proof is not Proof.INCOMPLETE and ranks:
                reference = ranks
            one = folder_checkpoint("deepspeed", inside, tag, step, proof, resume=save_dir)
            found.append(_rebased(one, save_dir, ((DS_LATEST, name(tag)),)))
    return RuleResult(tuple(found), frozenset(claimed))


def _rebased(found: Found, base: str, extras: tuple[tuple[str, str], ...]) -> Found:
    """``found`` with its files relative to ``base`` (a parent of its folder) and extras."""
    inner = relative(found.base, base)
    return dataclasses.replace(
        found, base=base, files=tuple(f"{inner}/{f}" for f in found.files), extras=extras
    )


# -- Megatron-LM --------------------------------------------------------------------------------
# megatron/training/checkpointing.py save_checkpoint: save_dir/iter_{N:07d}/ (legacy:
# mp_rank_XX[_YYY]/model_optim_rng.pt written in place; torch_dist: DCP files, then
# metadata.json by rank 0 once every rank's shards are written); after a barrier, rank 0 writes
# save_dir/latest_checkpointed_iteration.txt (the iteration): a folder up to the iteration it
# names, or one with metadata.json, is whole. --load save_dir reads the tracker.
_MEGATRON = re.compile(r"^iter_(\d{7,})$")
MEGATRON_TRACKER = "latest_checkpointed_iteration.txt"
MEGATRON_DIST_META = "metadata.json"


def _megatron_proof(tracked: str | None, step: int, newer: bool, dist_meta: bool) -> Proof:
    """Whole: the tracker names it or a later one, its metadata.json is there, or a newer
    iteration's folder exists (training went on past this save's barrier; the tracker is
    rewritten in place, so a torn one names nothing)."""
    if newer or dist_meta or (tracked is not None and tracked.isdigit() and int(tracked) >= step):
        return Proof.COMPLETE
    # A gang's other nodes never see rank 0's tracker: only quiet can tell there.
    return Proof.SETTLED if tracked is None else Proof.INCOMPLETE


def megatron(snapshot: Snapshot, contents: dict[str, str]) -> RuleResult:
    found, claimed = [], set()
    iterations = {
        folder: int(m.group(1))
        for folder in folders(f.path for f in snapshot)
        if (m := _MEGATRON.match(name(folder)))
    }
    for folder, step in iterations.items():
        inside = files_under(snapshot, folder)
        claimed |= claim_folder(inside)
        save_dir = parent(folder)
        newer = any(s > step and parent(f) == save_dir for f, s in iterations.items())
        tracker = f"{save_dir}/{MEGATRON_TRACKER}" if save_dir else MEGATRON_TRACKER
        claimed.add(tracker)
        dist_meta = has(inside, f"{folder}/{MEGATRON_DIST_META}")
        proof = _megatron_proof(text(contents, tracker), step, newer, dist_meta)
        one = folder_checkpoint("megatron", inside, folder, step, proof, resume=save_dir)
        found.append(_rebased(one, save_dir, ((MEGATRON_TRACKER, str(step)),)))
    return RuleResult(tuple(found), frozenset(claimed))


# -- NeMo 2 -------------------------------------------------------------------------------------
# nemo/lightning/pytorch/callbacks/model_checkpoint.py: "<dirpath>/<name>" folders holding
# weights/ (a Megatron distributed checkpoint) and context/, named from the template, e.g.
# "{model_name}--{val_loss:.2f}-{step}-{consumed_samples}" -> "...-step=99-consumed_samples=..",
# "-last" for save_last. Rank 0 touches the empty file "<name>-unfinished" beside the folder
# before the save and removes it after the finalising barrier: while it is there the folder is
# not whole. Resume with AutoResume(resume_from_path=<the folder>).
UNFINISHED = "-unfinished"
_NEMO_STEP = re.compile(r"(?:^|-)step=(\d+)")
_NEMO_SAMPLES = re.compile(r"(?:^|-)consumed_samples=(\d+)")


def _nemo_step(folder_name: str) -> int | None:
    m = _NEMO_STEP.search(folder_name) or _NEMO_SAMPLES.search(folder_name)
    return int(m.group(1)) if m else None


def nemo(snapshot: Snapshot, contents: dict[str, str]) -> RuleResult:
    del contents
    paths = {f.path for f in snapshot}
    markers = {p for p in paths if p.endswith(UNFINISHED)}
    found, claimed = [], set(markers)
    for folder in folders(paths):
        weights = f"{folder}/weights"
        if not any(under(p, weights) for p in paths) and folder + UNFINISHED not in markers:
            continue
        step = _nemo_step(name(folder))
        if step is None:
            continue
        inside = files_under(snapshot, folder)
        claimed |= claim_folder(inside)
        written = f"{weights}/{MEGATRON_DIST_META}" in paths or f"{weights}/{DCP_METADATA}" in paths
        proof = proof_of(written and folder + UNFINISHED not in markers)
        found.append(folder_checkpoint("nemo", inside, folder, step, proof))
    return RuleResult(tuple(found), frozenset(claimed))


# -- MindFormers --------------------------------------------------------------------------------
# mindformers/core/callback/callback.py CheckpointMonitor (legacy format, the default):
# <dir>/rank_<i>/<prefix>_rank_<i>-<epoch>_<step>.ckpt (or .safetensors), the step counted
# within the epoch; MindSpore's _exec_save writes <prefix>_rank_<i>-<epoch>_<step>.tmp (the
# suffix replaced) and renames it, so a file under its final name is whole (then chmods it
# 0400). Then record_last_ckpt_to_json replaces rank_<i>/meta.json {"last_epoch", "last_step",
# "last_ckpt_file"} (a tempfile tmpXXXXXXXX in the rank's folder, os.replace). Nothing syncs the
# ranks' saves: a checkpoint is whole once every rank folder there holds its file. Checkpoints
# order by (epoch, step in epoch): the key is epoch x 10^6 + step. Resume with load_checkpoint
# = <dir> and resume_training = True (tools/resume_ckpt.py picks the newest (epoch, step) every
# rank has, from the meta.json files). checkpoint_network/ and checkpoint_trainable/ hold
# partial saves: claimed, not resumed from.
_MF = re.compile(r"^(.+)_rank_(\d+)-(\d+)_(\d+)\.(?:ckpt|safetensors)$")
_MF_OTHER = re.compile(r"(?:^|/)(?:checkpoint_network|checkpoint_trainable)/rank_\d+/")
MF_META = "meta.json"
MF_EPOCH_KEY = 1_000_000


def _mf_meta(contents: dict[str, str], path: str) -> tuple[int, int] | None:
    raw = contents.get(path)
    if raw is None:
        return None
    try:
        meta = json.loads(raw)
        return int(meta["last_epoch"]), int(meta["last_step"])
    except (ValueError, KeyError, TypeError):
        return None


def _mf_proof(
    missing_ranks: bool, metas: list[tuple[int, int] | None], at: tuple[int, int]
) -> Proof:
    """Every rank folder must hold the checkpoint's file (a rank still writing has only its
    ``.tmp``), and every rank's meta.json name it or a newer one; a rank without meta.json yet
    (its first save, or an asynchronous save whose meta.json lags) leaves quiet to tell."""
    if missing_ranks:
        return Proof.INCOMPLETE
    if any(m is not None and m < at for m in metas):
        return Proof.INCOMPLETE
    return Proof.QUIET if None in metas else Proof.COMPLETE


def mindformers(snapshot: Snapshot, contents: dict[str, str]) -> RuleResult:
    groups: dict[tuple[str, int, int], list[FileInfo]] = defaultdict(list)
    rank_dirs: dict[str, set[str]] = defaultdict(set)  # <dir> -> its rank_<i> folders in use
    claimed: set[str] = set()
    for f in snapshot:
        if _MF_OTHER.search(f.path):
            claimed.add(f.path)
            continue
        rank_dir = parent(f.path)
        if not re.fullmatch(r"rank_\d+", name(rank_dir)):
            continue
        m = _MF.match(name(f.path))
        if m and f.link is None:
            groups[(parent(rank_dir), int(m.group(3)), int(m.group(4)))].append(f)
        # The checkpoints, meta.json, and the temporaries of both (<name>.tmp, tmpXXXXXXXX).
        if (
            m
            or name(f.path) == MF_META
            or name(f.path).endswith(".tmp")
            or name(f.path).startswith("tmp")
        ):
            claimed.add(f.path)
            rank_dirs[parent(rank_dir)].add(rank_dir)
    found = []
    for (root, epoch, step), files in groups.items():
        holding = {parent(f.path) for f in files}
        metas = [_mf_meta(contents, f"{d}/{MF_META}") for d in sorted(rank_dirs[root])]
        proof = _mf_proof(holding != rank_dirs[root], metas, (epoch, step))
        rel = [relative(f.path, root) for f in files]
        meta = {"last_epoch": epoch, "last_step": step}
        extras = tuple(
            sorted(
                (f"{parent(r)}/{MF_META}", json.dumps({**meta, "last_ckpt_file": name(r)}))
                for r in rel
            )
        )
        found.append(
            Found(
                format="mindformers",
                step=epoch * MF_EPOCH_KEY + step,
                base=root,
                files=tuple(sorted(rel)),
                resume=root,
                proof=proof,
                newest_mtime=max(f.mtime for f in files),
                extras=extras,
                name=min(f.path for f in files),
            )
        )
    return RuleResult(tuple(found), frozenset(claimed))
