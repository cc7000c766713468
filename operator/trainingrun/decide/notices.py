"""Who gets a preemption notice during a pass: a notice on one pod of the attempt reaches every
running pod of it.

The notice is the first found, by rank: a pod's own ``trainingrun.dev/preemption-notice``
annotation (put there by the node handler for an operator-wide notice taint, or by an earlier
pass), else a notice taint the run names (``spec.preemption.noticeTaints``) on the pod's node.
It goes to every pod of the attempt that does not carry it yet and has not stopped (phase
``Succeeded`` or ``Failed``): a gang's ranks then all save at the same step end while all are
alive. The annotation itself is written by the reconciler's apply step.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from trainingrun.contract import ANNOTATION_NOTICE
from trainingrun.decide.gang import Member
from trainingrun.decide.podview import node_notice


@dataclass(frozen=True)
class Notice:
    """The notice text, and the pods (by name) still to be told."""

    text: str
    pods: tuple[str, ...]


def _annotations(m: Member) -> dict[str, str]:
    return dict(((m.pod or {}).get("metadata") or {}).get("annotations") or {})


def hand_on(members: Sequence[Member], notice_taints: Iterable[str]) -> Notice | None:
    """The notice to pass on to the attempt's other pods, None when there is none or every
    running pod has it."""
    taints = tuple(notice_taints)
    text = None
    for m in members:
        if m.pod is None:
            continue
        text = _annotations(m).get(ANNOTATION_NOTICE) or node_notice(m.node, taints)
        if text:
            break
    if not text:
        return None
    pods = tuple(
        str(m.pod["metadata"]["name"])
        for m in members
        if m.pod is not None
        and ANNOTATION_NOTICE not in _annotations(m)
        and (m.pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
    )
    return Notice(text, pods) if pods else None
