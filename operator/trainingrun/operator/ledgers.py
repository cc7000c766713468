"""The goodput ledger's copy in each run's prefix (``decide.goodput.LEDGER_RECORD``): put after
every attempt's end, read back when a run's status has no ledger (lost, wiped). Display only:
a copy that cannot be read or written is logged, no more.
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import ValidationError

from trainingrun.api import AttemptRecord, Goodput, TrainingRunSpec, TrainingRunStatus
from trainingrun.checkpoint.progress import ProgressError, ProgressRecord
from trainingrun.decide import goodput
from trainingrun.decide.naming import RunRef
from trainingrun.operator.applier import Applier
from trainingrun.operator.buckets import MissingSecret, RunStores
from trainingrun.storage.opener import StorageError, log_text

log = logging.getLogger(__name__)


def wanted(status: TrainingRunStatus) -> bool:
    """Whether the status has no ledger of its own (a new run, or one that lost it)."""
    return status.goodput is None and not status.attempts


def read(stores: RunStores, ref: RunRef) -> tuple[Goodput, list[AttemptRecord]] | None:
    """The run's copy, when there is one of this run (its uid)."""
    try:
        data = stores.read_ledger(ref)
        return goodput.decode_ledger(data, ref.uid) if data is not None else None
    except (MissingSecret, StorageError, ValueError) as e:
        why = log_text(e) if isinstance(e, StorageError) else str(e)
        log.info("%s/%s: the goodput ledger is not restored: %s", ref.namespace, ref.name, why)
        return None


def write(stores: RunStores, ref: RunRef, status: TrainingRunStatus) -> None:
    """Puts the status's ledger as the run's copy."""
    data = goodput.encode_ledger(status, ref.uid)
    if data is None:
        return
    try:
        stores.write_ledger(ref, data)
    except (MissingSecret, StorageError) as e:
        why = log_text(e) if isinstance(e, StorageError) else str(e)
        log.info(
            "%s/%s: the goodput ledger's copy is not written: %s", ref.namespace, ref.name, why
        )


def look(
    stores: RunStores, ref: RunRef, status: TrainingRunStatus, tried: bool
) -> tuple[tuple[Goodput, list[AttemptRecord]] | None, bool]:
    """The run's copy when its status has none, and whether it was looked for in vain (not
    looked for again until the status has had a ledger: a wipe later is looked for anew)."""
    if not wanted(status):
        return None, False
    if tried:
        return None, True
    found = read(stores, ref)
    return found, found is None


def restore_finished(stores: RunStores, applier: Applier, run: dict[str, Any], tried: bool) -> bool:
    """A finished run whose status lost its ledger gets it back from the copy (no pass plans
    it); whether it was looked for in vain, as ``look``."""
    meta = run["metadata"]
    status = TrainingRunStatus.model_validate(run.get("status") or {})
    try:
        spec = TrainingRunSpec.model_validate(run.get("spec") or {})
    except ValidationError:
        return True
    ref = RunRef(name=meta["name"], namespace=meta["namespace"], uid=meta["uid"], spec=spec)
    found, tried = look(stores, ref, status, tried)
    restored = goodput.restored(status, found)
    if restored is not status:
        applier.write(meta["namespace"], meta["name"], run.get("status") or {}, restored)
    return tried


def last_word(stores: RunStores, ref: RunRef) -> ProgressRecord | None:
    """The last word a sidecar put at its end (``LAST_WORD_RECORD``): the trainer's last step of
    the attempt that ended; display only, a failed read is logged."""
    try:
        return stores.read_progress(ref, last_word=True)
    except (MissingSecret, StorageError, ProgressError) as e:
        why = log_text(e) if isinstance(e, StorageError) else str(e)
        log.info("%s/%s: no last word read: %s", ref.namespace, ref.name, why)
        return None
