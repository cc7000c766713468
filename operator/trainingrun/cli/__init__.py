"""``trainingrun``: one command, one subcommand per part. This docstring is for developers; what
``trainingrun --help`` says to users is in ``cli.helptext``.

- ``trainingrun operator``: the operator (kopf; ``trainingrun.operator.handlers``).
- ``trainingrun sync``: the checkpoint sync sidecar (configured by environment, set by the
  operator).
- ``trainingrun restore``: the restore init container (exit 3: the checkpoint is bad).
- ``trainingrun crd``: print the CustomResourceDefinition.
- ``trainingrun checkpoints list <run>``, ``trainingrun status <run>``: for users; also
  ``kubectl trainingrun ...``.

Sync and restore read their settings from the environment the operator gives them:
TRAININGRUN_STORAGE_URI, TRAININGRUN_CHECKPOINT_DIR; for s3:// AWS_ENDPOINT_URL, AWS_REGION and
credentials from the standard AWS chain; for gs:// and az:// TRAININGRUN_STORAGE_ENDPOINT and
the keys of ``contract.STORE_CREDENTIAL_KEYS`` (or the pod's identity); tuning:
TRAININGRUN_PART_SIZE_MB (16), TRAININGRUN_CONCURRENCY (16),
TRAININGRUN_MAX_BANDWIDTH_MBPS (none), TRAININGRUN_METRICS_PORT (9091, 0 = off),
TRAININGRUN_METRICS_ADDRESS (127.0.0.1); sync also TRAININGRUN_KEEP (3),
TRAININGRUN_QUIET_SECONDS (10), TRAININGRUN_DRAIN_SECONDS (60), TRAININGRUN_CHECKSUM (auto,
CRC64NVME, CRC32C, CRC32, SHA256), TRAININGRUN_PODINFO_DIR, TRAININGRUN_SYNC_NICE (10); restore
TRAININGRUN_RESTORE_STEP, TRAININGRUN_SIZE_LIMIT (none), TRAININGRUN_TERMINATION_LOG
(/dev/termination-log).
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import json
import logging
import math
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from trainingrun import contract as c


def _limit_malloc_arenas() -> None:
    """glibc gives each thread that allocates its own malloc arena (up to 8 per core); with the
    operator's worker threads that multiplies RSS for no gain. Two arenas are plenty."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return  # not glibc
    m_arena_max = -8
    libc.mallopt(m_arena_max, 2)


def _keep_out_the_kubernetes_client() -> None:
    """kopf imports the kubernetes client library, when it is there, only to recognise its
    model objects, which the operator never hands it: that import alone held 50 MB of the
    operator's memory. The operator talks to the API through ``trainingrun.operator.kubeconn``; a
    None
    in ``sys.modules`` makes kopf's ``import kubernetes`` fail as if it were not installed."""
    sys.modules.setdefault("kubernetes", None)  # type: ignore[arg-type]  # None blocks it


def _operator(args: argparse.Namespace) -> int:
    _keep_out_the_kubernetes_client()
    import kopf

    from trainingrun.operator.settings import ConfigurationError, OperatorSettings

    try:
        settings = OperatorSettings.from_env()
    except ConfigurationError as e:
        print(f"trainingrun operator: {e}", file=sys.stderr)
        return c.EXIT_USAGE
    _limit_malloc_arenas()

    from trainingrun.operator import handlers  # registers the handlers

    del handlers
    _logging(args.verbose)
    if not args.verbose:  # kopf logs every handler call at INFO
        logging.getLogger("kopf").setLevel(logging.WARNING)
    from prometheus_client import REGISTRY, start_http_server

    from trainingrun.operator.metrics import LeaderFlag

    leader = LeaderFlag(REGISTRY)  # 0 while waiting for the Lease: a standby's scrape says so
    if args.metrics_port:
        start_http_server(args.metrics_port, args.metrics_address, registry=REGISTRY)
    if args.leader_lease:
        _lead(args.leader_lease, args.liveness or None)
    leader.leading()
    kopf.run(
        clusterwide=not args.namespace,
        namespaces=args.namespace or (),
        standalone=not args.peering,
        peering_name=args.peering or None,
        liveness_endpoint=args.liveness or None,
        memo=kopf.Memo(settings=settings),
    )
    return 0


def _lead(lease: str, liveness: str | None) -> None:
    """Waits until this replica holds the Lease ``namespace/name`` (trainingrun.operator.leader)."""
    from trainingrun.operator import kubeconn, leader

    namespace, _, name = lease.rpartition("/")
    leader.lead(kubeconn.load(), name, namespace or "default", liveness=liveness)


class SettingsError(ValueError):
    """An agent setting in the environment is missing or malformed."""


def _env(env: Mapping[str, str], name: str, default: str | None = None) -> str:
    value = env.get(name, "") or default
    if value is None:
        raise SettingsError(f"{name} is not set; the operator sets it in the pod it builds")
    return value


def _number(env: Mapping[str, str], name: str, default: str, minimum: float = 0) -> float:
    raw = _env(env, name, default)
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not a number") from None
    if not math.isfinite(value):  # float() takes "nan" and "inf"; int() of them fails later
        raise SettingsError(f"{name}={raw!r} is not a finite number")
    if value < minimum:
        raise SettingsError(f"{name}={raw!r} must be at least {minimum}")
    return value


def _agent_common(env: Mapping[str, str]) -> tuple[Any, Any, Any]:
    """(store, run location, transfer settings) from the environment."""
    from trainingrun.agent.transfer import MiB, TransferSettings
    from trainingrun.storage.opener import parse_uri

    try:
        run = parse_uri(_env(env, c.ENV_STORAGE_URI))
    except ValueError as e:
        raise SettingsError(f"{c.ENV_STORAGE_URI}: {e}") from None
    bandwidth = env.get(c.ENV_MAX_BANDWIDTH_MBPS)
    part = int(_number(env, c.ENV_PART_SIZE_MB, "16", minimum=5) * MiB)
    transfer = TransferSettings(
        part_size=part,
        multipart_threshold=part,
        range_size=max(part, TransferSettings.range_size),
        concurrency=int(_number(env, c.ENV_CONCURRENCY, "16", minimum=1)),
        max_bytes_per_second=(
            _number(env, c.ENV_MAX_BANDWIDTH_MBPS, "0", minimum=0.1) * MiB if bandwidth else None
        ),
        memory_budget=int(_number(env, c.ENV_MEMORY_BUDGET_MB, "256", minimum=5) * MiB),
    )
    return _agent_store(env, run, 2 * transfer.concurrency + 4), run, transfer


def _agent_store(env: Mapping[str, str], run: Any, pool: int) -> Any:
    """The run's store as the pod builder set it up: for S3 the standard AWS variables, which
    boto3 reads itself (keys, web identity); for gs:// and az:// the endpoint and the Secret's
    keys the store reads (none: the pod's own identity)."""
    from trainingrun.storage.opener import StorageMisconfigured, open_location

    if run.scheme == "s3":
        endpoint = env.get(c.ENV_AWS_ENDPOINT_URL) or None
        secret = None
    else:
        endpoint = env.get(c.ENV_STORAGE_ENDPOINT) or None
        keys = c.STORE_CREDENTIAL_KEYS[run.scheme][0]
        secret = {k: env[k] for k in keys if env.get(k)} or None
    try:
        return open_location(run, endpoint, env.get(c.ENV_AWS_REGION) or None, secret, pool=pool)
    except StorageMisconfigured as e:
        raise SettingsError(str(e)) from None


def _serve_metrics(env: Mapping[str, str], registry: Any) -> None:
    from prometheus_client import start_http_server

    port = int(_number(env, c.ENV_METRICS_PORT, "9091"))
    if not port:
        return
    # Loopback unless the operator says otherwise (the pod's IP, for a PodMonitor): metrics are
    # nobody else's business on the pod network.
    address = env.get(c.ENV_METRICS_ADDRESS) or "127.0.0.1"
    try:
        start_http_server(port, address, registry=registry)
    except OSError as e:  # a taken port must not stop the checkpoints
        logging.getLogger("trainingrun").warning(
            "metrics not served on %s:%d: %s", address, port, e
        )


# Client libraries whose DEBUG output holds whole requests and responses (a Secret's data, the
# signed headers of every S3 call, every manifest): at WARNING even with --verbose.
# The cloud SDKs log every request (azure.core at INFO, urllib3 at DEBUG with SAS signatures).
QUIET_LOGGERS = (
    "kubernetes",
    "urllib3",
    "botocore",
    "boto3",
    "s3transfer",
    "azure",
    "google",
    "google_auth_httplib2",
)


def _logging(verbose: bool) -> None:
    """The root logger at DEBUG with ``verbose``, else INFO; QUIET_LOGGERS at WARNING."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


def _agent_logging(verbose: bool) -> None:
    _logging(verbose)
    logging.getLogger("watchdog").setLevel(logging.WARNING)  # an event per file written


def _sync(args: argparse.Namespace, env: Mapping[str, str] = os.environ) -> int:
    from trainingrun.agent import stopsignal

    stop = stopsignal.install()  # first: a SIGTERM during the slow start-up becomes a drain
    from trainingrun.agent import sidecar as syncsupport
    from trainingrun.agent import sync

    _agent_logging(args.verbose)
    try:
        store, run, transfer = _agent_common(env)
        podinfo = env.get(c.ENV_PODINFO_DIR)
        settings = syncsupport.SyncSettings(
            checkpoint_dir=Path(_env(env, c.ENV_CHECKPOINT_DIR)),
            run=run,
            keep=int(_number(env, c.ENV_KEEP, "3", minimum=1)),
            quiet_seconds=_number(env, c.ENV_QUIET_SECONDS, "10"),
            drain_seconds=_number(env, c.ENV_DRAIN_SECONDS, "60"),
            checksum=_env(env, c.ENV_CHECKSUM, "auto"),
            transfer=transfer,
            podinfo_dir=Path(podinfo) if podinfo else None,
            epoch=int(_number(env, c.ENV_EPOCH, "1", minimum=1)) if env.get(c.ENV_EPOCH) else None,
            attempt=int(_number(env, c.ENV_ATTEMPT, "0")),
            rank=int(_number(env, c.ENV_RANK, "0")),
            ranks=int(_number(env, c.ENV_RANKS, "1", minimum=1)),
            access_denied_seconds=_number(env, c.ENV_ACCESS_DENIED_SECONDS, "300", minimum=1),
            progress_seconds=_number(env, c.ENV_PROGRESS_SECONDS, "60", minimum=1),
            termination_log=Path(_env(env, c.ENV_TERMINATION_LOG, "/dev/termination-log")),
            **_layout(env),
        )
        if settings.rank >= settings.ranks:
            raise SettingsError(
                f"{c.ENV_RANK}={settings.rank} must be below {c.ENV_RANKS}={settings.ranks}"
            )
        nice = int(_number(env, c.ENV_SYNC_NICE, "10"))
    except SettingsError as e:
        print(f"trainingrun sync: {e}", file=sys.stderr)
        return c.EXIT_USAGE
    os.nice(nice)  # the trainer comes first for CPU
    metrics = syncsupport.Metrics()
    _serve_metrics(env, metrics.registry)
    return sync.main(store, settings, metrics, stop)


def _layout(env: Mapping[str, str]) -> dict[str, Any]:
    """The checkpoint format and pattern the sidecar looks for, checked."""
    from trainingrun.checkpoint import layouts

    fmt = _env(env, c.ENV_CHECKPOINT_FORMAT, layouts.AUTO)
    if fmt not in (layouts.AUTO, layouts.PATTERN, *layouts.FORMATS):
        known = ", ".join((layouts.AUTO, *layouts.FORMATS, layouts.PATTERN))
        raise SettingsError(f"{c.ENV_CHECKPOINT_FORMAT}={fmt!r} is not one of {known}")
    if fmt != layouts.PATTERN:
        return {"format": fmt}
    raw = _env(env, c.ENV_CHECKPOINT_PATTERN, "")
    try:
        fields = json.loads(raw)
        pattern = layouts.Pattern(
            glob=str(fields["glob"]),
            step=str(fields.get("step") or layouts.Pattern.step),
            marker=fields.get("marker") or None,
        )
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise SettingsError(
            f'{c.ENV_CHECKPOINT_PATTERN} must be JSON {{"glob": .., "step": .., '
            f'"marker": ..}} for format pattern, got {raw!r} ({e})'
        ) from e
    problem = pattern.problem()
    if problem is not None:
        raise SettingsError(problem)
    return {"format": fmt, "pattern": pattern}


def _restore(args: argparse.Namespace, env: Mapping[str, str] = os.environ) -> int:
    from trainingrun.agent import restore, room

    _agent_logging(args.verbose)
    try:
        store, run, transfer = _agent_common(env)
        raw_step = _env(env, c.ENV_RESTORE_STEP)
        if not (raw_step.isascii() and raw_step.isdigit()):  # "²".isdigit() is True
            raise SettingsError(f"{c.ENV_RESTORE_STEP}={raw_step!r} is not a step number")
        raw_limit = env.get(c.ENV_SIZE_LIMIT)
        try:
            size_limit = room.parse_size(raw_limit) if raw_limit else None
        except ValueError as e:
            raise SettingsError(f"{c.ENV_SIZE_LIMIT}: {e}") from None
        settings = restore.RestoreSettings(
            checkpoint_dir=Path(_env(env, c.ENV_CHECKPOINT_DIR)),
            run=run,
            step=int(raw_step),
            transfer=transfer,
            termination_log=Path(_env(env, c.ENV_TERMINATION_LOG, "/dev/termination-log")),
            size_limit=size_limit,
            tell_trainer=env.get(c.ENV_RESUME_WAIT) == "1",
        )
    except SettingsError as e:
        print(f"trainingrun restore: {e}", file=sys.stderr)
        return c.EXIT_USAGE
    metrics = restore.Metrics()
    _serve_metrics(env, metrics.registry)
    return restore.main(store, settings, metrics)


def _user(command: str, args: argparse.Namespace) -> int:
    from trainingrun.cli import runs as usercli

    try:
        return usercli.run_user_command(command, args)
    except BrokenPipeError:
        # The reader went away (`trainingrun status ... | head`): nothing more to say. Point
        # stdout at /dev/null so the interpreter's final flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _crd(_: argparse.Namespace) -> int:
    from trainingrun.api.crd import render

    sys.stdout.write(render())
    return 0


def main(argv: list[str] | None = None, prog: str = "trainingrun") -> int:
    from trainingrun.cli.commandline import build_parser

    handlers: dict[str, Callable[[argparse.Namespace], int]] = {
        "operator": _operator,
        "sync": _sync,
        "restore": _restore,
        "checkpoints list": functools.partial(_user, "checkpoints list"),
        "status": functools.partial(_user, "status"),
        "crd": _crd,
    }
    args = build_parser(prog, handlers).parse_args(argv)
    result: int = args.func(args)
    return result


def kubectl_plugin() -> int:
    """``kubectl trainingrun ...``: kubectl runs ``kubectl-trainingrun`` from PATH. The same
    commands and help, with the examples as the user types them."""
    return main(sys.argv[1:], prog="kubectl trainingrun")
