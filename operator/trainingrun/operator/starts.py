"""The start of an attempt: the run's fence in the bucket, the newest usable checkpoint, the
pods (``trainingrun.operator.launch``), and the status that records the started attempt; and what a
start that cannot reach the run's storage writes instead (a wait, or the run failed).

A start tries at most ``stores.START_TRIES`` committed checkpoints: those it passes over are
said in one ``CheckpointSkipped`` Event and recorded in ``status.badCheckpoints``, so no later
start reads them again; while older ones remain untried it waits, and the next try reads them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from typing import Any

from trainingrun.api import TrainingRunStatus
from trainingrun.checkpoint.lookup import Choice
from trainingrun.checkpoint.manifest import Layout, ManifestError, RunManifest
from trainingrun.checkpoint.protocol import StaleAttempt
from trainingrun.decide import reasons as R
from trainingrun.decide.naming import RunRef, gang_name_problem
from trainingrun.decide.pod import AgentSettings, build_pod, resume_of
from trainingrun.decide.reconcile import Observed, Plan, started
from trainingrun.decide.status import Event
from trainingrun.decide.waits import MIN_RETRY_SECONDS, Wait, secret_wait, wait, wait_over
from trainingrun.operator.buckets import MissingSecret, RunStores, public_message
from trainingrun.operator.events import EventSink
from trainingrun.operator.launch import Launched, Launcher
from trainingrun.operator.settings import OperatorSettings
from trainingrun.operator.statuswriter import StatusWriter
from trainingrun.storage.opener import StorageError, StorageMisconfigured, log_text

log = logging.getLogger("trainingrun.operator")


class Starter:
    """Starts attempts for the reconciler; writes through its ``StatusWriter``."""

    def __init__(
        self,
        stores: RunStores,
        launcher: Launcher,
        writer: StatusWriter,
        events: EventSink,
        settings: OperatorSettings,
    ) -> None:
        self.stores, self.launcher, self.writer = stores, launcher, writer
        self.events, self.settings = events, settings

    def start(
        self,
        run: dict[str, Any],
        ref: RunRef,
        obs: Observed,
        p: Plan,
        seen: tuple[bytes, str] | None = None,
        record: Callable[[], None] | None = None,
    ) -> float | None:
        """Creates the pods of ``p.status.attempt`` from the newest usable checkpoint.
        ``record``: given when the plan's status and Events are not written yet; they go in one
        write with the started attempt, or (by calling it) on their own first when the start
        stops short."""
        pending = [record] if record is not None else []

        def first() -> None:  # the plan's status and Events, before anything else is said
            while pending:
                pending.pop()()

        status = p.status
        problem = gang_name_problem(ref.name, status.attempt, ref.spec.replicas)
        if problem is not None:
            first()
            self.writer.fail(run, status, R.INVALID_SPEC, problem, obs.now)
            return None
        fenced = self._fence(run, ref, obs, status, seen, first)
        if not isinstance(fenced, tuple):
            return fenced
        choice, epoch, manifest = fenced
        recorded = status  # as written: what the writes below compare with
        if choice.rejected:
            first()  # the plan's Events before the checkpoints' own
            status, skipped = self._skipped(run, obs, status, choice, manifest)
            if skipped is not None:
                return self.writer.wait(run, recorded, skipped)
        pods = attempt_pods(ref, status.attempt, choice, epoch, self.settings.agent)
        launched = self.launcher.launch(run, ref, pods)
        if launched.first is None or launched.invalid is not None or launched.held is not None:
            first()
        if launched.invalid is not None:
            self.writer.fail(run, status, R.INVALID_SPEC, launched.invalid, obs.now)
        if launched.held is not None:
            self.writer.wait(run, recorded, held_by(launched, status, obs))  # status, then Event
        if launched.first is None:
            return launched.wait
        new, ev = started(status, obs, launched.first)
        new = wait_over(new, obs.generation, obs.now)
        unwritten = bool(pending)
        before = (
            (run.get("status") or {})
            if unwritten
            else recorded.model_dump(by_alias=True, mode="json")
        )
        self.writer.write(ref.namespace, ref.name, before, new)
        for told in p.events if unwritten else ():
            self.events.post(run, told.type, told.reason, told.message)
        self.events.post(run, ev.type, ev.reason, ev.message)
        return None

    def _skipped(
        self,
        run: dict[str, Any],
        obs: Observed,
        status: TrainingRunStatus,
        choice: Choice,
        manifest: RunManifest,
    ) -> tuple[TrainingRunStatus, Wait | None]:
        """Says the checkpoints ``choice`` passed over in one Event and records them as bad:
        the status to go on with, and the wait when older ones are still to be tried (the next
        try reads them, not these again)."""
        message = skipped_message(choice)
        self.events.post(run, "Warning", R.CHECKPOINT_SKIPPED, message)
        status = with_bad_steps(status, choice, manifest)
        if choice.entry is not None or not choice.untried:
            return status, None
        held = wait(status, obs.generation, R.CHECKPOINT_SKIPPED, message, obs.now)
        # Each try reads at most START_TRIES checkpoints, so the next comes soon, whatever the
        # wait so far: a run with many broken checkpoints starts within minutes, not hours.
        return status, replace(held, event=None, retry_after=MIN_RETRY_SECONDS)  # said above

    def _fence(
        self,
        run: dict[str, Any],
        ref: RunRef,
        obs: Observed,
        status: TrainingRunStatus,
        seen: tuple[bytes, str] | None,
        first: Callable[[], None],
    ) -> tuple[Choice, int, RunManifest] | float | None:
        """The run's fence for the attempt and the checkpoint it resumes from, with the
        attempt's epoch and the manifest as the fence left it; or, when the storage cannot give
        them, what the start waits (written after ``first``)."""
        namespace, name = ref.namespace, ref.name
        try:
            # The fence first: from here no older attempt can commit, so the choice below sees
            # every checkpoint there will be before this attempt's own.
            manifest, epoch = self.stores.take_fence(ref, status.attempt, seen)
            choice = self.stores.choose(ref, set(status.bad_checkpoints), manifest)
            return choice, epoch, manifest
        except (MissingSecret, StorageMisconfigured) as e:
            first()
            return self.unusable_storage(run, status, e, obs.now)
        except StaleAttempt as e:
            first()
            log.warning("%s/%s: not starting attempt %d: %s", namespace, name, status.attempt, e)
            return self.settings.resync_seconds
        except (StorageError, ManifestError) as e:
            first()
            # Without the manifest the newest checkpoint is unknown; starting fresh would lose
            # work, and without the fence an old attempt could still commit: wait for the bucket.
            why = log_text(e)
            log.warning(
                "%s/%s: cannot take the fence or choose a checkpoint: %s", namespace, name, why
            )
            why = R.MANIFEST_UNREADABLE if isinstance(e, ManifestError) else R.STORAGE_UNAVAILABLE
            said = public_message(e, ref.spec.checkpoint.storage)
            message = f"cannot take the fence or read checkpoints in the bucket, retrying: {said}"
            held = wait(status, obs.generation, why, message, obs.now)
            return self.writer.wait(run, status, held)

    def unusable_storage(
        self, run: dict[str, Any], status: TrainingRunStatus, e: Exception, now: datetime
    ) -> float | None:
        """No client of the run's storage: a settings error fails the run; a missing Secret is
        waited for, for ``secret_wait_seconds``, then fails it."""
        if isinstance(e, StorageMisconfigured):
            self.writer.fail(run, status, R.STORAGE_MISCONFIGURED, str(e), now)
            return None
        generation = int(run["metadata"].get("generation") or 0)
        held = secret_wait(status, generation, str(e), now, self.settings.secret_wait_seconds)
        if held is None:
            self.writer.fail(run, status, R.MISSING_SECRET, str(e), now)
            return None
        return self.writer.wait(run, status, held)


def attempt_pods(
    ref: RunRef, attempt: int, choice: Choice, epoch: int, agent: AgentSettings
) -> list[dict[str, Any]]:
    """The pods of ``attempt``, one per rank, resumed from the chosen checkpoint (none: from
    scratch)."""
    entry = choice.entry
    resume = (
        resume_of(ref, entry.step, Layout.resume_path(entry.layout, entry.step)) if entry else None
    )
    return [
        build_pod(ref, attempt, resume, agent, epoch, rank) for rank in range(ref.spec.replicas)
    ]


# How much of one passed-over checkpoint's reason an Event carries: three fit in Kubernetes'
# 1 KiB of Event message.
WHY_CHARS = 250


def skipped_message(choice: Choice) -> str:
    """The one Event a start says of the committed checkpoints it passed over, and of the older
    ones it did not try."""
    said = [
        (step, why if len(why) <= WHY_CHARS else why[: WHY_CHARS - 3] + "...")
        for step, why in choice.rejected
    ]
    if len(said) == 1:
        told = f"checkpoint {said[0][0]} not used: {said[0][1]}"
    else:
        each = "; ".join(f"checkpoint {step}: {why}" for step, why in said)
        told = f"{len(said)} checkpoints not used: {each}"
    if choice.untried:
        told += f"; {choice.untried} older not tried yet: the next try reads them"
    return told


def with_bad_steps(
    status: TrainingRunStatus, choice: Choice, manifest: RunManifest
) -> TrainingRunStatus:
    """``status`` with the steps ``choice`` passed over recorded as bad: no later start reads
    them again. Bad steps the manifest no longer names are dropped, so the list holds at most
    as many as a manifest may (MAX_ENTRIES)."""
    named = {e.step for e in manifest.entries}
    bad = [s for s in status.bad_checkpoints if s in named]
    bad += [step for step, _ in choice.rejected if step not in bad]
    return status.model_copy(update={"bad_checkpoints": bad})


def held_by(launched: Launched, status: TrainingRunStatus, obs: Observed) -> Wait:
    """Why the attempt's pods wait (``launched.held``), as the run's status and the Event said
    after it: when the reason is new, or again when the launcher says it is due again."""
    assert launched.held is not None
    why, message = launched.held
    held = wait(status, obs.generation, why, message, obs.now)
    if launched.say_again and held.event is None:
        held = replace(held, event=Event(R.event_type(why), why, message))
    return held
