"""Room on the checkpoint volume for a restore: a size limit as Kubernetes writes it
(``spec.checkpoint.sizeLimit``, e.g. ``50Gi``), what the folder already holds, and the check
before a download, which tells a checkpoint too big for the limit (every attempt's pod has the
same: ``InsufficientDisk``) from a node short of disk now (``NodeDiskFull``: retried).
"""

from __future__ import annotations

import errno
import math
import os
import re
import shutil
from decimal import Decimal
from pathlib import Path

from trainingrun.contract import format_bytes


class InsufficientDisk(Exception):
    """The chosen checkpoint does not fit the checkpoint folder; the message says by how much."""


class NodeDiskFull(Exception):
    """The checkpoint fits the size limit (or there is none) but not the node's free disk now."""


# The errors of a full volume: no space on the device, or the user's quota reached.
DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})


DISK_FIX = "raise spec.checkpoint.sizeLimit or use nodes with more disk"


NODE_FIX = (
    "the attempt is retried (counted against maxRestarts), on this node or another; set "
    "spec.checkpoint.sizeLimit and an ephemeral-storage request in the template so that the "
    "scheduler picks a node with room, or use nodes with more disk"
)


# A Kubernetes quantity of bytes as spec.checkpoint.sizeLimit takes it: digits with an optional
# fraction, then a power of ten (an exponent or a decimal suffix; K as well as Kubernetes' k) or
# of two. No sign, no milli: a byte count.
QUANTITY = re.compile(r"([0-9]+(?:\.[0-9]+)?)(?:[eE]([0-9]{1,2})|(Ki|Mi|Gi|Ti|Pi|Ei|[kKMGTPE])?)")


SCALE = {
    **{s: 1000**i for i, s in enumerate(("", "k", "M", "G", "T", "P", "E"))},
    "K": 1000,
    **{s: 1024 ** (i + 1) for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"))},
}


MAX_QUANTITY = 2**63 - 1  # Kubernetes' largest


def parse_size(text: str) -> int:
    """The bytes of a quantity such as ``50Gi``, ``1.5T``, ``2e9`` or ``1000``, rounded up to
    a whole byte; ValueError for anything else."""
    m = QUANTITY.fullmatch(text)
    if m is None:
        raise ValueError(f"{text!r} is not a quantity of bytes such as 50Gi, 500M or 1000")
    number, exponent, suffix = m.groups()
    scale: int = 10 ** int(exponent) if exponent is not None else SCALE[suffix or ""]
    size = math.ceil(Decimal(number) * scale)
    if size > MAX_QUANTITY:
        raise ValueError(f"{text!r} is more than the largest quantity, {MAX_QUANTITY} bytes")
    return size


def folder_bytes(folder: Path) -> int:
    """The bytes of the files under ``folder``: what it already takes of its volume."""
    held = 0
    for root, _dirs, names in os.walk(folder):
        for name in names:
            try:
                held += Path(root, name).lstat().st_size
            except OSError:
                continue  # gone while we looked
    return held


def byte_count(n: int) -> str:
    return f"{n} bytes ({format_bytes(n)})"


def check_room(checkpoint_dir: Path, size_limit: int | None, what: str, needed: int) -> int:
    """The bytes the checkpoint folder has room for: its volume's free space and, under a size
    limit, that limit less what the folder already holds (the kubelet evicts a pod whose
    emptyDir grows past it). When ``needed`` is more, raises InsufficientDisk for the limit
    (every attempt's pod has the same), else NodeDiskFull (another node's disk, or this one's
    later, may have room)."""
    room = shutil.disk_usage(checkpoint_dir).free
    if size_limit is not None:
        held = folder_bytes(checkpoint_dir)
        allowed = max(size_limit - held, 0)
        if needed > allowed:
            raise InsufficientDisk(
                f"{what} needs {byte_count(needed)}, only {byte_count(allowed)} left under the "
                f"volume's size limit of {byte_count(size_limit)}, which holds {byte_count(held)} "
                f"already: {DISK_FIX}"
            )
        room = min(room, allowed)
    if needed > room:
        raise NodeDiskFull(
            f"{what} needs {byte_count(needed)}, only {byte_count(room)} free on the checkpoint "
            f"volume now: {NODE_FIX}"
        )
    return room
