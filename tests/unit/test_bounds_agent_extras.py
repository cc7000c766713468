"""A layout's extra files against the checkpoint's own (``trainingrun.agent.restore``).

Covers: an extra file (a pointer the restore writes beside a checkpoint, such as DeepSpeed's
``latest``) whose name is also a checkpoint file's is not written: the verified file stays as
it was downloaded, the restore succeeds, and its log names the extra and why; extras that clash
with nothing are still written.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import cast

import pytest

from tests.unit.fakes import FakeBucket
from trainingrun.agent.restore import Metrics, RestoreSettings, main
from trainingrun.checkpoint.manifest import Layout
from trainingrun.contract import EXIT_OK
from trainingrun.storage.opener import Location, Store

RUN = Location("ckpt", "runs/ml/r1")
STEP = 50
POINTER = b"global_step50\n"  # what the trainer wrote, uploaded and verified


def _restore(store: FakeBucket, tmp_path: Path) -> tuple[int, Path]:
    folder = tmp_path / "checkpoints"
    settings = RestoreSettings(
        checkpoint_dir=folder, run=RUN, step=STEP, termination_log=tmp_path / "termination-log"
    )
    return main(cast(Store, store), settings, Metrics()), folder


@pytest.mark.parametrize(
    "base", [pytest.param("", id="at-the-top"), pytest.param("ds", id="under-a-base")]
)
def test_an_extra_named_like_a_checkpoint_file_does_not_overwrite_it(
    tmp_path: Path, base: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = FakeBucket()
    files = {"latest": POINTER, "global_step50/mp_rank_00_model_states.pt": b"w" * 64}
    extras = {"latest": "global_step999", "zero_to_fp32.txt": "a pointer of its own"}
    layout = Layout(format="deepspeed", base=base, resume=base, extras=extras)
    store.commit(RUN, STEP, files=files, layout=layout)

    with caplog.at_level(logging.WARNING, logger="trainingrun.agent.restore"):
        code, folder = _restore(store, tmp_path)

    assert code == EXIT_OK
    where = folder / base
    assert (where / "latest").read_bytes() == POINTER
    assert (where / "global_step50/mp_rank_00_model_states.pt").read_bytes() == b"w" * 64
    assert (where / "zero_to_fp32.txt").read_text() == "a pointer of its own"
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "'latest'" in warning and "checkpoint file" in warning


def test_extras_that_clash_with_nothing_are_written(tmp_path: Path) -> None:
    store = FakeBucket()
    files = {"global_step50/mp_rank_00_model_states.pt": b"w" * 64}
    layout = Layout(format="deepspeed", extras={"latest": "global_step50"})
    store.commit(RUN, STEP, files=files, layout=layout)

    code, folder = _restore(store, tmp_path)

    assert code == EXIT_OK
    assert (folder / "latest").read_text() == "global_step50"
