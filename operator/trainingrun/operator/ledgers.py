"""The goodput ledger's copy in each run's prefix (``decide.goodput.LEDGER_RECORD``): put after
every attempt's end, read back when a run's status has no ledger (lost, wiped). Display only:
a copy that cannot be read or written is logged, no more.
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import ValidationError

from trainingrun.api import AttemptRecord, Goodput, TrainingRunSpec, TrainingRunStatus
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


def restore_finished(
    stores: RunStores, applier: Applier, run: dict[str, Any], status: TrainingRunStatus
) -> None:
    """A finished run's status gets its ledger back from the copy (no pass plans it)."""
    meta = run["metadata"]
    try:
        spec = TrainingRunSpec.model_validate(run.get("spec") or {})
    except ValidationError:
        return
    ref = RunRef(name=meta["name"], namespace=meta["namespace"], uid=meta["uid"], spec=spec)
    restored = goodput.restored(status, read(stores, ref))
    if restored is not status:
        applier.write(meta["namespace"], meta["name"], run.get("status") or {}, restored)
