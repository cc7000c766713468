"""A node's disk short for a moment is not a run's end (``trainingrun.agent.restore``, then
``decide.classify`` and ``decide.policy`` on what it said).

Covers:

- the restore over an in-memory bucket and a real folder, its exit code and termination message
  fed to the classifier and the policy as the operator reads them: a checkpoint that fits
  ``spec.checkpoint.sizeLimit`` (or with no limit) but not the node's free space, before the
  download or as the volume fills up during it (ENOSPC, EDQUOT), is a failed attempt, retried
  with backoff and counted against ``maxRestarts``; one larger than the size limit (less what
  the folder holds) still ends the run (``InsufficientDisk``), whatever the node's free space;
- the classifier on restore endings (init container, or beside the trainer): the node's disk
  short now is ``Failed``/``NodeDiskFull`` with the restore's message; any other message, or
  none, of the insufficient-disk code is ``Permanent``/``InsufficientDisk``;
- the policy: a ``NodeDiskFull`` failure resubmits after the backoff, spends a restart, and
  ends the run once ``maxRestarts`` is spent, naming the disk.
"""

from __future__ import annotations

import errno
import os
import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import NamedTuple, cast

import pytest

from tests.unit.builders import make_node, make_run, pod_from, restart_policy
from tests.unit.fakes import FakeBucket
from trainingrun.agent.restore import Metrics, RestoreSettings, main
from trainingrun.api import DEFAULT_NOTICE_TAINTS
from trainingrun.contract import EXIT_INSUFFICIENT_DISK
from trainingrun.decide.classify import End, Outcome, classify
from trainingrun.decide.pod import AgentSettings, build_pod, resume_of
from trainingrun.decide.policy import Action, Counters, decide
from trainingrun.storage.opener import Location, Store

RUN = Location("ckpt", "runs/ml/r1")
STEP = 120
GiB = 1 << 30
FILES = {"model.safetensors": b"w" * 4000, "trainer_state.json": b"{}"}
NEEDED = sum(len(data) for data in FILES.values())
NOW = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)
READY = make_node("n1").build()
_REF = make_run("r1").with_checkpoint(STEP).ref()
RESUMED_POD = build_pod(_REF, 2, resume_of(_REF, STEP), AgentSettings(), epoch=2)


class Usage(NamedTuple):
    total: int
    used: int
    free: int


def _restore(tmp_path: Path, size_limit: int | None) -> tuple[int, str]:
    """(exit code, termination message) of the restore of STEP."""
    store = FakeBucket()
    store.commit(RUN, STEP, files=FILES)
    log = tmp_path / "termination-log"
    settings = RestoreSettings(
        checkpoint_dir=tmp_path / "checkpoints",
        run=RUN,
        step=STEP,
        termination_log=log,
        size_limit=size_limit,
    )
    code = main(cast(Store, store), settings, Metrics())
    return code, log.read_text() if log.exists() else ""


def _classified(code: int, message: str, beside: bool = False) -> Outcome:
    """What the operator makes of the restore's ending in the attempt's pod."""
    pod = pod_from(RESUMED_POD)
    ended = pod.restore_beside_exited if beside else pod.restore_exited
    return classify(
        ended(code, message=message or None).build(),
        node=READY,
        node_deleted=False,
        notice_taints=DEFAULT_NOTICE_TAINTS,
        now=NOW,
    )


def _free(monkeypatch: pytest.MonkeyPatch, free: int) -> None:
    monkeypatch.setattr(shutil, "disk_usage", lambda _path: Usage(100 * GiB, 0, free))


# -- the restore, then the classifier ----------------------------------------------------------


@pytest.mark.parametrize(
    ("free", "limit", "end", "reason"),
    [
        pytest.param(NEEDED - 1, None, End.FAILED, "NodeDiskFull", id="no-limit-node-short"),
        pytest.param(NEEDED - 1, NEEDED, End.FAILED, "NodeDiskFull", id="fits-limit-node-short"),
        pytest.param(
            NEEDED - 1, 10 * NEEDED, End.FAILED, "NodeDiskFull", id="roomy-limit-node-short"
        ),
        pytest.param(
            100 * GiB, NEEDED - 1, End.PERMANENT, "InsufficientDisk", id="over-limit-node-roomy"
        ),
        pytest.param(
            NEEDED - 1, NEEDED - 1, End.PERMANENT, "InsufficientDisk", id="over-limit-node-short"
        ),
    ],
)
def test_too_little_room_before_the_download(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    free: int,
    limit: int | None,
    end: End,
    reason: str,
) -> None:
    _free(monkeypatch, free)

    code, message = _restore(tmp_path, limit)
    outcome = _classified(code, message)

    assert code == EXIT_INSUFFICIENT_DISK
    assert (outcome.end, outcome.reason) == (end, reason)
    assert f"{NEEDED} bytes" in message and f"checkpoint-{STEP}" in outcome.message
    if end is End.FAILED:
        assert f"{free} bytes" in message and "retried" in message
    else:
        assert "raise spec.checkpoint.sizeLimit" in message


@pytest.mark.parametrize("error", [errno.ENOSPC, errno.EDQUOT], ids=errno.errorcode.get)
@pytest.mark.parametrize("limit", [None, 10 * NEEDED], ids=["no-limit", "fits-limit"])
def test_the_volume_filling_up_during_the_download_is_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: int, limit: int | None
) -> None:
    def full(fd: int, data: bytes, offset: int) -> int:
        raise OSError(error, os.strerror(error))

    monkeypatch.setattr(os, "pwrite", full)

    code, message = _restore(tmp_path, limit)
    outcome = _classified(code, message)

    assert code == EXIT_INSUFFICIENT_DISK
    assert (outcome.end, outcome.reason) == (End.FAILED, "NodeDiskFull")
    assert os.strerror(error) in outcome.message and f"{NEEDED} bytes" in outcome.message
    assert not (tmp_path / "checkpoints" / f"checkpoint-{STEP}").exists()


# -- the classifier ----------------------------------------------------------------------------


NODE_SHORT = (
    "insufficient disk on this node: checkpoint-120 needs 2000 bytes (2.0 KiB), only 1000 "
    "bytes (1000 B) free on the checkpoint volume"
)


@pytest.mark.parametrize("beside", [False, True], ids=["init", "beside-the-trainer"])
@pytest.mark.parametrize(
    ("message", "end", "reason"),
    [
        pytest.param(NODE_SHORT, End.FAILED, "NodeDiskFull", id="node-short"),
        pytest.param(NODE_SHORT + "\n", End.FAILED, "NodeDiskFull", id="node-short-newline"),
        pytest.param(
            "insufficient disk: checkpoint-120 needs 2000 bytes, only 1000 bytes left under "
            "the volume's size limit",
            End.PERMANENT,
            "InsufficientDisk",
            id="over-the-limit",
        ),
        pytest.param("", End.PERMANENT, "InsufficientDisk", id="no-message"),
        pytest.param(
            "no room: insufficient disk on this node",
            End.PERMANENT,
            "InsufficientDisk",
            id="words-elsewhere",
        ),
    ],
)
def test_what_the_insufficient_disk_code_means(
    message: str, end: End, reason: str, beside: bool
) -> None:
    outcome = _classified(EXIT_INSUFFICIENT_DISK, message, beside)

    assert (outcome.end, outcome.reason) == (end, reason)
    if message:
        assert outcome.message == message.strip()


# -- the policy --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("restarts", "action", "reason"),
    [
        pytest.param(0, Action.RESUBMIT, "Failed", id="first"),
        pytest.param(2, Action.RESUBMIT, "Failed", id="last-restart-left"),
        pytest.param(3, Action.FAIL, "RestartBudgetExhausted", id="budget-spent"),
    ],
)
def test_a_node_short_of_disk_spends_a_restart_and_waits(
    restarts: int, action: Action, reason: str
) -> None:
    policy = restart_policy(max_restarts=3, crash_loop_limit=10)
    outcome = _classified(EXIT_INSUFFICIENT_DISK, NODE_SHORT)

    decision = decide(
        outcome,
        Counters(restarts=restarts, consecutive_failures=restarts, stalled=restarts),
        policy,
        resume_step=STEP,
        latest_step=STEP,
    )

    assert (decision.action, decision.reason) == (action, reason)
    assert decision.counters.restarts == restarts + 1
    assert NODE_SHORT in decision.message
    if action is Action.RESUBMIT:
        assert decision.delay_seconds >= policy.backoff.initial_seconds
        assert decision.message.startswith("NodeDiskFull: ")
