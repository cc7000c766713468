"""Commands for users: ``trainingrun checkpoints list <run>`` and ``trainingrun status <run>``
(also ``kubectl trainingrun ...`` through the ``kubectl-trainingrun`` plugin executable).

They read the TrainingRun from the cluster (current kubeconfig context), and the bucket with the
run's own storage settings and credentials Secret, exactly as the operator does.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any, TextIO

import urllib3

from trainingrun import api
from trainingrun.checkpoint.lookup import check_committed, read_run_manifest
from trainingrun.checkpoint.manifest import ManifestError
from trainingrun.cli import ledger
from trainingrun.contract import format_bytes
from trainingrun.decide.naming import RunRef, run_prefix
from trainingrun.operator.kube import Kube, load_config
from trainingrun.operator.kubeconn import HttpError, KubeConfigError, from_kubeconfig
from trainingrun.storage.opener import (
    Location,
    StorageError,
    Store,
    open_store,
    parse_uri,
    secret_credentials,
)


class UserError(Exception):
    """Something the user can fix; printed as one line, exit code 1."""


def current_namespace(kubeconfig: str | None) -> str:
    try:
        return from_kubeconfig(kubeconfig).namespace or "default"
    except KubeConfigError:
        return "default"


def get_run(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    run = kube.get_run(namespace, name)
    if run is None:
        raise UserError(
            f"TrainingRun {namespace}/{name} not found (kubectl get trainingruns -n {namespace})"
        )
    return run


def run_store(kube: Kube, run: dict[str, Any]) -> tuple[Store, Location]:
    """The run's bucket with its own endpoint, region and credentials Secret, and the run's place
    in it: the one the operator gives the run's sync sidecar."""
    meta = run["metadata"]
    namespace = meta["namespace"]
    spec = api.TrainingRunSpec.model_validate(run["spec"])
    storage = spec.checkpoint.storage
    creds = None
    location = parse_uri(run_prefix(RunRef(meta["name"], namespace, meta["uid"], spec)))
    if storage.credentials_secret:
        data = kube.get_secret_data(namespace, storage.credentials_secret)
        creds = secret_credentials(namespace, storage.credentials_secret, data, location.scheme)
    return open_store(storage, creds), location


def checkpoint_rows(
    store: Store, location: Location, bad: set[int]
) -> list[tuple[int, str, str, str, str]]:
    """(step, size, committed, files, verified) for every committed checkpoint, newest first.
    Verified: as the operator checks a checkpoint before resuming from it (check_committed)."""
    manifest = read_run_manifest(store, location)
    if manifest is None:
        return []
    rows = []
    for entry in sorted(manifest.entries, key=lambda e: -e.step):
        if entry.step in bad:
            # status.badCheckpoints: a restore found it corrupt, or a start found it incomplete
            verified = "no: marked bad (status.badCheckpoints)"
        else:
            ckpt, why = check_committed(store, location, entry)
            verified = "yes" if ckpt is not None else f"no: {why}"
        rows.append(
            (entry.step, format_bytes(entry.bytes), entry.committed, str(entry.files), verified)
        )
    return rows


def table(headers: list[str], rows: list[list[str]], out: TextIO) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    for line in [headers, *rows]:
        out.write("   ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() + "\n")


def cmd_checkpoints_list(kube: Kube, args: argparse.Namespace, out: TextIO) -> int:
    run = get_run(kube, args.namespace, args.run)
    store, location = run_store(kube, run)
    bad = set((run.get("status") or {}).get("badCheckpoints") or [])
    rows = checkpoint_rows(store, location, bad)
    if not rows:
        out.write(f"no committed checkpoints yet in s3://{location.bucket}/{location.prefix}/\n")
        return 0
    table(
        ["STEP", "SIZE", "COMMITTED", "FILES", "VERIFIED"],
        [[str(r[0]), r[1], r[2], r[3], r[4]] for r in rows],
        out,
    )
    return 0


def cmd_status(kube: Kube, args: argparse.Namespace, out: TextIO) -> int:
    run = get_run(kube, args.namespace, args.run)
    status = run.get("status") or {}
    latest = status.get("latestCheckpoint") or {}
    fmt = f", format {latest['format']}" if latest.get("format") else ""
    lines = [
        ("Name", f"{args.namespace}/{args.run}"),
        ("Phase", status.get("phase") or "Pending"),
        ("Reason", status.get("reason") or ""),
        ("Message", status.get("message") or ""),
        ("Attempt", str(status.get("attempt", 0))),
        ("Restarts", str(status.get("restarts", 0))),
        ("Preemptions", str(status.get("preemptions", 0))),
        ("Active pod", status.get("activePod") or ""),
        ("Resumed from", str(status["resumeStep"]) if status.get("resumeStep") is not None else ""),
        (
            "Latest checkpoint",
            f"step {latest['step']}{fmt} ({latest.get('uri', '')}, {latest.get('time', '')})"
            if latest
            else "none",
        ),
        ("Progress", progress_line(status.get("progress") or {})),
        ("Goodput", ledger.goodput_line(status.get("goodput") or {})),
        ("Save estimate", save_line(status.get("saveEstimate") or {})),
        ("Bad checkpoints", ", ".join(map(str, status.get("badCheckpoints") or []))),
        ("Next attempt", status.get("nextAttemptTime") or ""),
    ]
    width = max(len(k) for k, _ in lines) + 1
    for key, value in lines:
        if value:
            out.write(f"{key + ':':<{width}} {value}\n")
    attempts = status.get("attempts") or []
    if attempts:
        out.write("Attempts (times since the run was created):\n")
        created = (run.get("metadata") or {}).get("creationTimestamp")
        table(ledger.HEADERS, ledger.attempt_rows(attempts, created), out)
    attempt = int(status.get("attempt") or 0)
    pods = kube.attempt_pods(args.namespace, args.run, attempt) if attempt else []
    if pods:
        out.write(f"Pods of attempt {attempt}:\n")
        table(["  NAME", "PHASE", "NODE", "REASON"], [pod_row(pod) for pod in pods], out)
    conditions = status.get("conditions") or []
    if conditions:
        out.write("Conditions:\n")
        table(
            ["  TYPE", "STATUS", "REASON", "SINCE", "MESSAGE"],
            [
                [
                    "  " + c.get("type", ""),
                    c.get("status", ""),
                    c.get("reason", ""),
                    c.get("lastTransitionTime", ""),
                    c.get("message", ""),
                ]
                for c in conditions
            ],
            out,
        )
    return 0


def progress_line(progress: dict[str, Any]) -> str:
    """The trainer's step, of how many, its rate and the ETA, and when the sidecar saw it."""
    if not progress:
        return ""
    total = progress.get("totalSteps")
    parts = [f"step {progress.get('step', 0)}" + (f" of {total}" if total else "")]
    if progress.get("percent") is not None:
        parts[0] += f" ({progress['percent']:g}%)"
    for key, unit in (
        ("stepsPerSecond", "steps/s"),
        ("samplesPerSecond", "samples/s"),
        ("tokensPerSecond", "tokens/s"),
    ):
        if progress.get(key):
            parts.append(f"{progress[key]:.3g} {unit}")
    if progress.get("estimatedCompletionTime"):
        parts.append(f"ETA {progress.get('eta')} ({progress['estimatedCompletionTime']})")
    seen = f"seen {progress.get('observedAt', '')} (attempt {progress.get('attempt', 0)})"
    return ", ".join(parts) + "; " + seen


def save_line(est: dict[str, Any]) -> str:
    """Whether a save on preemption fits, and the estimate against each window."""
    if not est:
        return ""
    verdict = "fits" if est.get("fits") else "DOES NOT FIT"
    seconds = float(est.get("uploadSeconds", 0))
    return (
        f"{seconds:.{1 if seconds < 10 else 0}f} s to upload, {verdict} the "
        f"{est.get('windowSeconds', 0)} s a save has ({est.get('message', '')})"
    )


def pod_row(pod: dict[str, Any]) -> list[str]:
    """One pod of the attempt: name, phase (Terminating while deleted), node, why it ended."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    phase = "Terminating" if meta.get("deletionTimestamp") else status.get("phase") or "Pending"
    return [
        "  " + str(meta.get("name", "")),
        str(phase),
        str((pod.get("spec") or {}).get("nodeName") or "-"),
        str(status.get("reason") or ""),
    ]


COMMANDS: dict[str, Callable[[Kube, argparse.Namespace, TextIO], int]] = {
    "checkpoints list": cmd_checkpoints_list,
    "status": cmd_status,
}


def run_user_command(command: str, args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    fn = COMMANDS[command]
    if not args.namespace:
        args.namespace = current_namespace(args.kubeconfig)
    try:
        kube = Kube(load_config(args.kubeconfig, pool_size=4))
        return fn(kube, args, out)
    except (UserError, StorageError, ManifestError, KubeConfigError, HttpError) as e:
        sys.stderr.write(f"trainingrun: {e}\n")
        return 1
    except urllib3.exceptions.HTTPError as e:
        sys.stderr.write(f"trainingrun: the Kubernetes API server did not answer: {e}\n")
        return 1
