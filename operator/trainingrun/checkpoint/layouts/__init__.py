"""Checkpoint layouts of the common trainers, as small pure rules.

Given a snapshot of the local checkpoint folder (``FileInfo`` per file, plus the text of the few
small pointer files a framework rewrites each save, ``POINTER_FILES``), ``find`` says which
checkpoints are there: the step of each, its files, whether it is whole, and what the trainer's
resume argument is. ``spec.checkpoint.format`` picks the rule: ``auto`` tries every rule, most
specific first (a path one rule claims is not offered to the next), and reports which formats
it recognised and which files no rule claims (``Scan.unrecognised``), so a run writing a layout
nobody reads is reported instead of silently unprotected.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from trainingrun.checkpoint.layouts import distributed as dist
from trainingrun.checkpoint.layouts import frameworks as fw
from trainingrun.checkpoint.layouts.base import (
    COMPLETE_MARKER,
    CONTROL_DIR,
    STAGING_PREFIX,
    FileInfo,
    Found,
    Proof,
    RuleResult,
    claim_folder,
    file_checkpoint,
    files_under,
    folder_checkpoint,
    folders,
    has,
    is_control,
    is_ours,
    is_staging,
    marker_for,
    proof_of,
)
from trainingrun.checkpoint.layouts.frameworks import TRAINER_STATE
from trainingrun.contract import DEFAULT_STEP_PATTERN, pattern_problem

__all__ = [
    "AUTO",
    "COMPLETE_MARKER",
    "CONTROL_DIR",
    "FORMATS",
    "PATTERN",
    "POINTER_FILES",
    "STAGING_PREFIX",
    "TRAINER_STATE",
    "FileInfo",
    "Found",
    "Pattern",
    "Proof",
    "Scan",
    "find",
    "is_control",
    "marker_for",
]

AUTO = "auto"
PATTERN = "pattern"
Rule = Callable[[Sequence[FileInfo], dict[str, str]], RuleResult]
# Most specific first: NeMo's weights/ and Lightning's sharded .ckpt/ folders are in DCP form,
# so the generic DCP rule comes last.
RULES: dict[str, Rule] = {
    "hf": fw.hf,
    "nemo": dist.nemo,
    "megatron": dist.megatron,
    "deepspeed": dist.deepspeed,
    "mindformers": dist.mindformers,
    "composer": fw.composer,
    "lightning": fw.lightning,
    "accelerate": fw.accelerate,
    "dcp": fw.dcp,
}
FORMATS = tuple(RULES)
# Small files a framework rewrites on each save to name its newest checkpoint; the snapshot
# carries their text (the rules read it, nothing uploads it).
POINTER_FILES = frozenset({dist.DS_LATEST, dist.MEGATRON_TRACKER, dist.MF_META})
POINTER_MAX_BYTES = 64 * 1024


@dataclass(frozen=True)
class Pattern:
    """A user's own layout: ``glob`` matches each checkpoint (a file or a folder, relative to
    the checkpoint folder, fnmatch syntax); ``step`` is a regular expression whose first group,
    searched in the matched path, is the step; ``marker``, a file inside a matched folder the
    trainer writes last (without it, a checkpoint is whole once quiet)."""

    glob: str
    step: str = DEFAULT_STEP_PATTERN
    marker: str | None = None

    def problem(self) -> str | None:
        """Why the pattern cannot work, or None."""
        return pattern_problem(self.glob, self.step)


def pattern_rule(p: Pattern) -> Rule:
    step_re = re.compile(p.step)
    glob = p.glob.rstrip("/")

    def rule(snapshot: Sequence[FileInfo], contents: dict[str, str]) -> RuleResult:
        del contents
        found, claimed = [], set()
        for folder in folders(f.path for f in snapshot):
            if not fnmatch.fnmatchcase(folder, glob):
                continue
            inside = files_under(snapshot, folder)
            claimed |= claim_folder(inside)
            m = step_re.search(folder)
            if m:
                proof = Proof.QUIET  # no marker named: whole once quiet
                if p.marker is not None:
                    proof = proof_of(has(inside, f"{folder}/{p.marker}"))
                found.append(folder_checkpoint(PATTERN, inside, folder, int(m.group(1)), proof))
        for f in snapshot:
            if f.path in claimed or f.link or not fnmatch.fnmatchcase(f.path, glob):
                continue
            claimed.add(f.path)
            m = step_re.search(f.path)
            if m:
                found.append(file_checkpoint(PATTERN, snapshot, f, int(m.group(1))))
        return RuleResult(tuple(found), frozenset(claimed))

    return rule


@dataclass(frozen=True)
class Scan:
    checkpoints: tuple[Found, ...]  # one per step (the newest file wins a tie), oldest first
    formats: tuple[str, ...]  # formats that found a checkpoint, in rule order
    unrecognised: tuple[str, ...]  # files no rule claims, sorted


def find(
    snapshot: Sequence[FileInfo],
    contents: dict[str, str] | None = None,
    fmt: str = AUTO,
    pattern: Pattern | None = None,
) -> Scan:
    """The checkpoints in ``snapshot`` by the rule of ``fmt`` (``auto``: every rule)."""
    contents = contents or {}
    if fmt == PATTERN:
        if pattern is None:
            raise ValueError("format 'pattern' needs checkpoint.pattern")
        rules = {PATTERN: pattern_rule(pattern)}
    elif fmt == AUTO:
        rules = RULES
    elif fmt in RULES:
        rules = {fmt: RULES[fmt]}
    else:
        raise ValueError(f"unknown checkpoint format {fmt!r}; one of {AUTO}, {', '.join(FORMATS)}")
    # The rules see our markers (they prove a checkpoint complete), never the control folder
    # or a restore's staging folder.
    left = [f for f in snapshot if not is_control(f.path) and not is_staging(f.path)]
    by_step: dict[int, Found] = {}
    formats = []
    for label, rule in rules.items():
        result = rule(left, contents)
        if result.found:
            formats.append(label)
        for c in result.found:
            held = by_step.get(c.step)
            if held is None or (c.newest_mtime, c.name) > (held.newest_mtime, held.name):
                by_step[c.step] = c
        left = [f for f in left if f.path not in result.claimed]
    unrecognised = tuple(sorted(f.path for f in left if not is_ours(f.path)))
    return Scan(tuple(by_step[s] for s in sorted(by_step)), tuple(formats), unrecognised)
