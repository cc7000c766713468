"""The checkpoint layout rules (trainingrun.checkpoint.layouts) on real folders, through
``local.survey``.

Covers, for every format (HF Trainer, Lightning, Composer, DCP, DeepSpeed, Megatron-LM, NeMo 2,
MindFormers, Accelerate) and DeepSpeed's ZeRO-3, bf16 and stage 0 files, saves laid out as the
framework's source writes them (tests/trainer_layouts.py):

- two whole saves: both found, by auto and by the format's own name, with the step, the files
  to upload, the resume argument and the pointer files the restore writes; nothing left
  unrecognised;
- a save killed half-way (every strict prefix of its operations, and each prefix with the next
  file cut short): never complete when the trainer has just died, so a drain never commits it;
  the older whole save stays complete; a first save killed half-way (no older one) neither;
- the files of one format are not taken for another's, an unknown layout is reported as
  unrecognised, and a user's pattern (folder or file, step regex, marker) works and is checked;
- torch.distributed.checkpoint and Accelerate's save_state, the real libraries, write folders
  the rules recognise (a DCP folder without .metadata is not whole).
"""

from __future__ import annotations

import os
from pathlib import Path

import accelerate
import pytest
import torch
import torch.distributed.checkpoint as dcp
from accelerate.utils import ProjectConfiguration

from tests.trainer_layouts import CASES, SAVES, Op, Save, apply
from trainingrun.checkpoint import layouts, local
from trainingrun.checkpoint.layouts import Pattern, Proof

T0 = 1_000_000.0  # the time every file of the first save is written at
QUIET = 10.0


def _save_both(folder: Path, case: str) -> tuple[Save, Save]:
    first, second = CASES[case](10), CASES[case](20)
    apply(folder, first.ops, T0)
    apply(folder, second.ops, T0 + 100)
    return first, second


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("chosen", ["auto", "named"])
def test_whole_saves_are_found(tmp_path: Path, case: str, chosen: str) -> None:
    first, second = _save_both(tmp_path, case)
    fmt = first.format

    found = local.survey(tmp_path, fmt if chosen == "named" else layouts.AUTO)

    assert [c.step for c in found.checkpoints] == [first.step, second.step]
    assert found.formats == (fmt,)
    assert found.unrecognised == ()
    for save, c in zip((first, second), found.checkpoints, strict=True):
        assert c.found.format == fmt
        assert c.complete(T0 + 100 + QUIET, QUIET, trainer_gone=False)
        prefix = f"{c.found.base}/" if c.found.base else ""
        uploaded = {prefix + rel for rel, _ in c.files}
        assert uploaded == set(save.restored) - set(save.extras)
        assert {prefix + p: t for p, t in c.found.extras} == save.extras
        assert c.found.resume == save.resume
        assert all(size == (tmp_path / prefix / rel).stat().st_size for rel, size in c.files)


def _killed(save: Save) -> list[tuple[str, list[Op]]]:
    """Every strict prefix of the save, and each with the next written file cut short; except
    the HF Trainer's trainer_state.json cut short: the file it writes last is trusted (a few KB
    written in one call; the rule reads no file contents)."""
    out = []
    for i in range(len(save.ops)):
        out.append((f"after-{i}-ops", save.ops[:i]))
        op, path, arg = save.ops[i]
        trusted = save.format == "hf" and i == len(save.ops) - 1
        if op == "write" and isinstance(arg, bytes) and len(arg) > 1 and not trusted:
            out.append((f"cut-in-op-{i}", [*save.ops[:i], ("write", path, arg[: len(arg) // 2])]))
    return out


KILLED = [
    pytest.param(case, label, ops, id=f"{case}-{label}")
    for case in CASES
    for label, ops in _killed(CASES[case](20))
]


@pytest.mark.parametrize(("case", "label", "ops"), KILLED)
def test_a_save_killed_half_way_is_never_complete(
    tmp_path: Path, case: str, label: str, ops: list[Op]
) -> None:
    first = CASES[case](10)
    apply(tmp_path, first.ops, T0)
    apply(tmp_path, ops, T0 + 100)

    by_step = {c.step: c for c in local.scan(tmp_path, first.format)}

    killed = by_step.get(CASES[case](20).step)
    # The trainer died just now: the drain looks once, with nothing quiet yet.
    assert killed is None or not killed.complete(T0 + 101, QUIET, trainer_gone=True)
    assert by_step[first.step].complete(T0 + 101, QUIET, trainer_gone=True)


# MindFormers is left out: until a rank has written anything of its first save its folder does
# not exist, and nothing in the others' folders says how many ranks there are.
KILLED_FIRST = [
    pytest.param(case, label, ops, id=f"{case}-{label}")
    for case in CASES
    if case != "mindformers"
    for label, ops in _killed(CASES[case](10))
]


@pytest.mark.parametrize(("case", "label", "ops"), KILLED_FIRST)
def test_a_first_save_killed_half_way_is_never_complete(
    tmp_path: Path, case: str, label: str, ops: list[Op]
) -> None:
    save = CASES[case](10)
    apply(tmp_path, ops, T0)

    by_step = {c.step: c for c in local.scan(tmp_path, save.format)}

    killed = by_step.get(save.step)
    assert killed is None or not killed.complete(T0 + 1, QUIET, trainer_gone=True)


def test_a_mindformers_rank_behind_keeps_the_checkpoint_incomplete(tmp_path: Path) -> None:
    """Rank 0 has renamed its file and replaced its meta.json; rank 1, a save behind, has only
    its ``.tmp``: the checkpoint is not whole, whatever rank 0's meta.json says."""
    apply(tmp_path, SAVES["mindformers"](10).ops, T0)
    second = SAVES["mindformers"](20)
    rank0_done = [op for op in second.ops if "/rank_0/" in op[1]]
    apply(tmp_path, [*rank0_done, second.ops[len(rank0_done)]], T0 + 100)

    by_step = {c.step: c for c in local.scan(tmp_path, "mindformers")}

    assert second.ops[len(rank0_done)][1].endswith("/rank_1/llama_rank_1-1_20.tmp")
    assert by_step[second.step].found.proof is Proof.INCOMPLETE
    assert by_step[second.step].files == (("rank_0/llama_rank_0-1_20.ckpt", 3000),)
    assert by_step[1_000_010].found.proof is Proof.COMPLETE


def test_one_formats_files_are_not_taken_for_anothers(tmp_path: Path) -> None:
    for case in CASES:
        apply(tmp_path, CASES[case](10).ops, T0)

    found = local.survey(tmp_path)

    assert set(found.formats) == set(SAVES)
    assert found.unrecognised == ()
    assert len(found.checkpoints) == 2  # one per step: 10 and MindFormers' 1_000_010
    for fmt in SAVES:
        only = local.scan(tmp_path, fmt)
        assert [c.found.format for c in only] == [fmt], fmt


def test_an_unknown_layout_is_reported_not_uploaded(tmp_path: Path) -> None:
    apply(tmp_path, [("write", "run/weights-000100.bin", b"w"), ("write", "notes.txt", b"n")])
    (tmp_path / ".trainingrun").mkdir()
    (tmp_path / ".trainingrun" / "progress.json").write_text("{}")

    found = local.survey(tmp_path)

    assert found.checkpoints == []
    assert found.formats == ()
    assert found.unrecognised == ("notes.txt", "run/weights-000100.bin")


def test_pattern_of_folders_with_a_marker(tmp_path: Path) -> None:
    apply(
        tmp_path, [("write", "out/step_00300/w.bin", b"a"), ("write", "out/step_00300/DONE", b"")]
    )
    apply(tmp_path, [("write", "out/step_00400/w.bin", b"b")])  # no marker yet
    pattern = Pattern(glob="out/step_*", step=r"step_(\d+)", marker="DONE")

    found = local.survey(tmp_path, layouts.PATTERN, pattern)

    assert [(c.step, c.found.proof) for c in found.checkpoints] == [
        (300, Proof.COMPLETE),
        (400, Proof.INCOMPLETE),
    ]
    assert found.checkpoints[0].files == (("DONE", 0), ("w.bin", 1))
    assert found.checkpoints[0].found.resume == "out/step_00300"


def test_pattern_of_files_is_whole_once_quiet(tmp_path: Path) -> None:
    apply(tmp_path, [("write", "ckpt-7.pt", b"abc")], T0)

    [c] = local.scan(tmp_path, layouts.PATTERN, Pattern(glob="ckpt-*.pt"))

    assert (c.step, c.found.resume, c.files) == (7, "ckpt-7.pt", (("ckpt-7.pt", 3),))
    assert not c.complete(T0 + 1, QUIET, trainer_gone=True)
    assert c.complete(T0 + QUIET, QUIET, trainer_gone=False)


@pytest.mark.parametrize(
    ("pattern", "problem"),
    [
        pytest.param(Pattern(glob="x", step=r"\d+"), "needs a group", id="no-group"),
        pytest.param(Pattern(glob="x", step=r"(\d+"), "not a regular expression", id="bad-re"),
        pytest.param(Pattern(glob="**"), "matches everything", id="everything"),
    ],
)
def test_unusable_patterns_are_named(pattern: Pattern, problem: str) -> None:
    assert problem in (pattern.problem() or "")


def test_unknown_format_is_named() -> None:
    with pytest.raises(ValueError, match="unknown checkpoint format 'keras'"):
        layouts.find([], {}, "keras")


def test_our_marker_beside_a_file_proves_it_whole(tmp_path: Path) -> None:
    apply(tmp_path, SAVES["lightning"](30).ops, T0)
    ckpt = tmp_path / "lightning_logs" / "epoch=0-step=30.ckpt"

    local.mark_complete(ckpt)
    [c] = local.scan(tmp_path, "lightning")

    assert c.found.proof is Proof.COMPLETE
    assert c.files == (("epoch=0-step=30.ckpt", ckpt.stat().st_size),)


# -- the real libraries ----------------------------------------------------------------------


def test_torch_distributed_checkpoint_writes_a_folder_the_rule_reads(tmp_path: Path) -> None:
    state = {"w": torch.arange(1000, dtype=torch.float32), "step": torch.tensor(40)}
    dcp.save(state, checkpoint_id=str(tmp_path / "run" / "step_40"))

    [c] = local.scan(tmp_path)
    assert (c.step, c.found.format, c.found.proof) == (40, "dcp", Proof.COMPLETE)
    assert c.found.resume == "run/step_40"
    assert ".metadata" in {rel for rel, _ in c.files}

    os.remove(tmp_path / "run" / "step_40" / ".metadata")  # as if the coordinator was killed
    [c] = local.scan(tmp_path)
    assert c.found.proof is Proof.INCOMPLETE


def test_accelerate_save_state_writes_a_folder_the_rule_reads(tmp_path: Path) -> None:
    config = ProjectConfiguration(
        project_dir=str(tmp_path / "project"), automatic_checkpoint_naming=True
    )
    acc = accelerate.Accelerator(project_config=config, cpu=True)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = acc.prepare(model, optimizer)
    acc.save_state()
    acc.save_state()

    found = local.survey(tmp_path)
    assert found.formats == ("accelerate",)
    assert found.unrecognised == ()
    assert [c.step for c in found.checkpoints] == [0, 1]
    last = found.checkpoints[-1]
    assert last.found.resume == "project/checkpoints/checkpoint_1"
    assert last.found.proof is Proof.SETTLED
    assert {rel for rel, _ in last.files} >= {"optimizer.bin", "random_states_0.pkl"}
