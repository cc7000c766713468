"""The start of an attempt: the run's fence in the bucket, the newest usable checkpoint, the
pods (``trainingrun.operator.launch``), and the status that records the started attempt; and what a
start that cannot reach the run's storage writes instead (a wait, or the run failed).

A start tries at most ``stores.START_TRIES`` committed checkpoints: those it passes over are
said in one ``CheckpointSkipped`` Event and recorded in ``status.badCheckpoints``, so no later
start reads them again; while older ones remain untried it waits, and the next try reads them.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import datetime
from typing import Any

from trainingrun.api import TrainingRunStatus
from trainingrun.checkpoint.lookup import Choice
from trainingrun.checkpoint.manifest import Layout, ManifestError, RunManifest
from trainingrun.checkpoint.protocol import StaleAttempt
from trainingrun.decide import reasons as R
from trainingrun.decide.naming import RunRef, gang_name_problem
from trainingrun.decide.observed import Observed, Plan
from trainingrun.decide.pod import AgentSettings, build_pod, resume_of
from trainingrun.decide.reconcile import started
from trainingrun.decide.status import Event
from trainingrun.decide.waits import MIN_RETRY_SECONDS, Wait, secret_wait, wait, wait_over
from trainingrun.operator.applier import Applier
from trainingrun.operator.buckets import MissingSecret, RunStores, public_message
from trainingrun.operator.launch import Launched, Launcher
from trainingrun.operator.settings import OperatorSettings
from trainingrun.storage.opener import StorageError, StorageMisconfigured, log_text

log = logging.getLogger("trainingrun.operator")


class Starter:
    """Starts attempts for the reconciler; writes through its ``Applier``."""

    def __init__(
        self,
        stores: RunStores,
        launcher: Launcher,
        applier: Applier,
        settings: OperatorSettings,
    ) -> None:
        self.stores, self.launcher, self.applier = stores, launcher, applier
        self.settings = settings

    def start(
        self,
        run: dict[str, Any],
        ref: RunRef,
        obs: Observed,
        p: Plan,
        seen: tuple[bytes, str] | None = None,
        recorded: bool = True,
    ) -> float | None:
        """Creates the pods of ``p.status.attempt`` from the newest usable checkpoint.
        ``recorded``: whether the plan's status and Events are written already; when not, they
        go in one write with the started attempt, or on their own first when the start stops
        short (every write through the applier)."""
        status = p.status
        problem = gang_name_problem(ref.name, status.attempt, ref.spec.replicas)
        if problem is not None:
            recorded = self._record(run, ref, p, recorded)
            self.applier.fail(run, status, R.INVALID_SPEC, problem, obs.now)
            return None
        fenced = self._fence(ref, status, seen)
        if not isinstance(fenced, tuple):
            recorded = self._record(run, ref, p, recorded)
            return self._unfenced(run, ref, obs, status, fenced)
        choice, epoch, manifest = fenced
        written = status  # as written: what the writes below compare with
        if choice.rejected:
            recorded = self._record(run, ref, p, recorded)  # the plan's Events before these
            status, skipped = self._skipped(run, obs, status, choice, manifest)
            if skipped is not None:
                return self.applier.wait(run, written, skipped)
        pods = attempt_pods(ref, status.attempt, choice, epoch, self.settings.agent)
        launched = self.launcher.launch(ref, pods)
        if launched.first is None or launched.invalid is not None or launched.held is not None:
            recorded = self._record(run, ref, p, recorded)
        if launched.invalid is not None:
            self.applier.fail(run, status, R.INVALID_SPEC, launched.invalid, obs.now)
        if launched.held is not None:  # the status, then its Event
            self.applier.wait(run, written, held_by(launched, status, obs))
        if launched.first is None:
            return launched.wait
        new, ev = started(status, obs, launched.first)
        new = wait_over(new, obs.generation, obs.now)
        before = (
            (run.get("status") or {})
            if not recorded
            else written.model_dump(by_alias=True, mode="json")
        )
        self.applier.write(ref.namespace, ref.name, before, new)
        self.applier.say(run, [*(p.events if not recorded else ()), ev])
        return None

    def _record(self, run: dict[str, Any], ref: RunRef, p: Plan, recorded: bool) -> bool:
        """The plan's status and Events, unless written already; returns True."""
        if not recorded:
            self.applier.record(run, ref, p)
        return True

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
        self.applier.say(run, [Event("Warning", R.CHECKPOINT_SKIPPED, message)])
        status = with_bad_steps(status, choice, manifest)
        if choice.entry is not None or not choice.untried:
            return status, None
        held = wait(status, obs.generation, R.CHECKPOINT_SKIPPED, message, obs.now)
        # Each try reads at most START_TRIES checkpoints, so the next comes soon, whatever the
        # wait so far: a run with many broken checkpoints starts within minutes, not hours.
        return status, replace(held, event=None, retry_after=MIN_RETRY_SECONDS)  # said above

    def _fence(
        self, ref: RunRef, status: TrainingRunStatus, seen: tuple[bytes, str] | None
    ) -> tuple[Choice, int, RunManifest] | Exception:
        """The run's fence for the attempt and the checkpoint it resumes from, with the
        attempt's epoch and the manifest as the fence left it; or why the storage cannot give
        them."""
        try:
            # The fence first: from here no older attempt can commit, so the choice below sees
            # every checkpoint there will be before this attempt's own.
            manifest, epoch = self.stores.take_fence(ref, status.attempt, seen)
            choice = self.stores.choose(ref, set(status.bad_checkpoints), manifest)
            return choice, epoch, manifest
        except (
            MissingSecret,
            StorageMisconfigured,
            StaleAttempt,
            StorageError,
            ManifestError,
        ) as e:
            return e

    def _unfenced(
        self,
        run: dict[str, Any],
        ref: RunRef,
        obs: Observed,
        status: TrainingRunStatus,
        e: Exception,
    ) -> float | None:
        """What a start the storage stopped writes: a wait, or the run failed."""
        namespace, name = ref.namespace, ref.name
        if isinstance(e, (MissingSecret, StorageMisconfigured)):
            return self.unusable_storage(run, status, e, obs.now)
        if isinstance(e, StaleAttempt):
            log.warning("%s/%s: not starting attempt %d: %s", namespace, name, status.attempt, e)
            return self.settings.resync_seconds
        # Without the manifest the newest checkpoint is unknown; starting fresh would lose
        # work, and without the fence an old attempt could still commit: wait for the bucket.
        why = log_text(e)
        log.warning("%s/%s: cannot take the fence or choose a checkpoint: %s", namespace, name, why)
        reason = R.MANIFEST_UNREADABLE if isinstance(e, ManifestError) else R.STORAGE_UNAVAILABLE
        said = public_message(e, ref.spec.checkpoint.storage)
        message = f"cannot take the fence or read checkpoints in the bucket, retrying: {said}"
        held = wait(status, obs.generation, reason, message, obs.now)
        return self.applier.wait(run, status, held)

    def unusable_storage(
        self, run: dict[str, Any], status: TrainingRunStatus, e: Exception, now: datetime
    ) -> float | None:
        """No client of the run's storage: a settings error fails the run; a missing Secret is
        waited for, for ``secret_wait_seconds``, then fails it."""
        if isinstance(e, StorageMisconfigured):
            self.applier.fail(run, status, R.STORAGE_MISCONFIGURED, str(e), now)
            return None
        generation = int(run["metadata"].get("generation") or 0)
        held = secret_wait(status, generation, str(e), now, self.settings.secret_wait_seconds)
        if held is None:
            self.applier.fail(run, status, R.MISSING_SECRET, str(e), now)
            return None
        return self.applier.wait(run, status, held)


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
