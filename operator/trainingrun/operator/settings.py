"""Every setting of the operator, read from the environment and validated once, at start.

Nothing else in the operator reads ``os.environ``. A bad value stops the operator at start with
a ``ConfigurationError`` that names the variable and what it takes, rather than a traceback at
the first event. The chart sets these variables from its values (charts/trainingrun).

- TRAININGRUN_AGENT_IMAGE, TRAININGRUN_AGENT_PULL_POLICY: the image of the injected restore and
  sync containers (default: this release's agent image, IfNotPresent).
- TRAININGRUN_AGENT_RESOURCES: their resources as JSON, ``{"requests": {..}, "limits": {..}}``
  (default: requests cpu 100m, memory 128Mi; limits memory 512Mi).
- TRAININGRUN_RESYNC_SECONDS (10): every run is looked at this often, even without events.
- TRAININGRUN_RESYNC_RATE (10): at most this many of those periodic looks a second; a fleet
  larger than rate x seconds is looked at less often (5,000 runs: every 500 s).
- TRAININGRUN_CHECKPOINT_REFRESH_SECONDS (15): a running attempt's newest committed checkpoint
  is re-read this often.
- TRAININGRUN_NOTICE_TAINTS (none): notice taint keys beyond the built-in ones, comma-separated.
- TRAININGRUN_WORKERS (8): passes of different runs that run in parallel.
- TRAININGRUN_AGENT_METRICS (loopback): where the sync sidecar serves metrics: loopback, pod
  (its pod IP, to be scraped) or off.
- TRAININGRUN_AGENT_ACCESS_DENIED_SECONDS (300): how long the sync sidecar goes on through
  nothing but access denied before it exits for the kubelet to restart it with fresh keys.
- TRAININGRUN_CLUSTER_DOMAIN (cluster.local): the cluster's DNS domain (the kubelet's
  ``--cluster-domain``); a gang's master address is rank 0's fully qualified name in it.
- TRAININGRUN_SECRET_WAIT_SECONDS (600): how long an attempt's start waits for a missing
  credentials Secret before the run fails with MissingSecret.
- TRAININGRUN_ALLOWED_ENDPOINTS (none: any): the storage endpoints runs may name, comma-separated
  URLs (scheme, host and optional port); "aws", "gcs" and "azure" allow AWS S3, Google Cloud
  Storage and Azure Blob Storage themselves (no endpoint). Set, any other endpoint fails the run
  with StorageNotAllowed.
- TRAININGRUN_ALLOWED_URIS (none: any): the prefixes runs' storage.uri must start with,
  comma-separated s3://, gs:// or az:// URIs (the admin's base paths).
- TRAININGRUN_RUN_METRICS (on): export per-run metrics (``trainingrun_run_*``) from the cache at
  scrape time: on or off.
- TRAININGRUN_RUN_METRICS_KEEP_FINISHED_SECONDS (3600): how long a run that ended stays in them;
  0 exports only unfinished runs.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from trainingrun.api import DEFAULT_NOTICE_TAINTS
from trainingrun.decide.pod import AgentSettings
from trainingrun.decide.storagepolicy import bad_allowlist_entries

PULL_POLICIES = ("Always", "IfNotPresent", "Never")
METRICS_MODES = ("loopback", "pod", "off")
SWITCH = {"on": True, "off": False}
RESOURCE_SECTIONS = ("requests", "limits")
# A Kubernetes resource quantity (apimachinery's resource.Quantity): 100m, 512Mi, 1.5, 2e3.
QUANTITY = re.compile(
    r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+|[numkMGTPE]|[KMGTPE]i)?"
)


# A DNS domain of lowercase labels, such as cluster.local (RFC 1123 labels, 253 characters).
_LABEL = r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
DNS_DOMAIN = re.compile(rf"(?=.{{1,253}}$){_LABEL}(\.{_LABEL})*")


class ConfigurationError(ValueError):
    """An operator setting in the environment is malformed; the message names it."""


@dataclass(frozen=True)
class OperatorSettings:
    agent: AgentSettings = field(default_factory=AgentSettings)
    # How often every run is looked at even without events: a safety net, checkpoint refresh.
    resync_seconds: float = 10.0
    # At most this many of those periodic passes a second, whatever the number of runs: a
    # large fleet's interval stretches (5,000 runs: 500 s) instead of its load growing.
    resync_rate: float = 10.0
    # How often a running attempt's latest checkpoint is re-read from the bucket manifest.
    checkpoint_refresh_seconds: float = 15.0
    # How often at most a running attempt's progress record is read, with a manifest refresh:
    # display only, and the status changes for progress alone at most this often.
    progress_refresh_seconds: float = 60.0
    # Notice taint keys the admin adds for the whole cluster (a run may name its own too).
    extra_notice_taints: tuple[str, ...] = ()
    # Worker threads for passes: passes of one run are serialised, of different runs parallel.
    workers: int = 8
    # Credentials are re-read this often, so a rotated or newly created Secret is picked up.
    secret_ttl_seconds: float = 30.0
    # How long an attempt's start waits for a missing credentials Secret (a rotation tool may
    # delete and re-create it) before the run fails with MissingSecret.
    secret_wait_seconds: float = 600.0
    # How soon the create of an attempt's pod is tried again while its name is taken by a pod
    # that is not the run's, and how often the PodNameTaken Event is repeated meanwhile.
    name_taken_retry_seconds: float = 5.0
    name_taken_repeat_seconds: float = 60.0
    # The admin's allowlists of storage endpoints and uri prefixes (empty: any).
    allowed_endpoints: tuple[str, ...] = ()
    allowed_uris: tuple[str, ...] = ()
    # Per-run metrics at scrape time (up to 24 series a run); off for a fleet whose Prometheus
    # should not carry them.
    run_metrics: bool = True
    # A run that ended stays in them this long, so its final figures are scraped, then drops out.
    run_metrics_keep_finished_seconds: float = 3600.0

    @property
    def notice_taints(self) -> tuple[str, ...]:
        """The operator-wide notice taint keys: built-in and the admin's."""
        return (*DEFAULT_NOTICE_TAINTS, *self.extra_notice_taints)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> OperatorSettings:
        env = os.environ if env is None else env
        agent = _agent_settings(env)
        taints = env.get("TRAININGRUN_NOTICE_TAINTS", "")
        endpoints = _list(env, "TRAININGRUN_ALLOWED_ENDPOINTS")
        uris = _list(env, "TRAININGRUN_ALLOWED_URIS")
        bad = bad_allowlist_entries(endpoints, uris)
        if bad:
            raise ConfigurationError(
                f"TRAININGRUN_ALLOWED_ENDPOINTS / TRAININGRUN_ALLOWED_URIS: {', '.join(bad)} "
                "can never match: endpoints are http(s)://host[:port], aws, gcs or azure; uris "
                "s3://bucket/..., gs://bucket/... or az://account/container/..."
            )
        return cls(
            agent=agent,
            resync_seconds=_seconds(env, "TRAININGRUN_RESYNC_SECONDS", cls.resync_seconds),
            resync_rate=_number(env, "TRAININGRUN_RESYNC_RATE", cls.resync_rate, minimum=0.1),
            checkpoint_refresh_seconds=_seconds(
                env, "TRAININGRUN_CHECKPOINT_REFRESH_SECONDS", cls.checkpoint_refresh_seconds
            ),
            progress_refresh_seconds=_seconds(
                env, "TRAININGRUN_PROGRESS_REFRESH_SECONDS", cls.progress_refresh_seconds
            ),
            extra_notice_taints=tuple(t.strip() for t in taints.split(",") if t.strip()),
            workers=int(_number(env, "TRAININGRUN_WORKERS", cls.workers, minimum=1, whole=True)),
            secret_wait_seconds=_number(
                env, "TRAININGRUN_SECRET_WAIT_SECONDS", cls.secret_wait_seconds, minimum=0
            ),
            allowed_endpoints=endpoints,
            allowed_uris=uris,
            run_metrics=_switch(env, "TRAININGRUN_RUN_METRICS", cls.run_metrics),
            run_metrics_keep_finished_seconds=_number(
                env,
                "TRAININGRUN_RUN_METRICS_KEEP_FINISHED_SECONDS",
                cls.run_metrics_keep_finished_seconds,
                minimum=0,
            ),
        )


def _switch(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name, "").strip().lower()
    if not raw:
        return default
    if raw not in SWITCH:
        raise ConfigurationError(f"{name}={raw!r} must be on or off")
    return SWITCH[raw]


def _list(env: Mapping[str, str], name: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in env.get(name, "").split(",") if v.strip())


def _number(
    env: Mapping[str, str], name: str, default: float, *, minimum: float, whole: bool = False
) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigurationError(f"{name}={raw!r} is not a number") from None
    if not math.isfinite(value) or value < minimum:
        raise ConfigurationError(f"{name}={raw!r} must be a finite number >= {minimum:g}")
    if whole and not value.is_integer():
        raise ConfigurationError(f"{name}={raw!r} must be a whole number")
    return value


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    # Below 0.1 s a resync or refresh would spin the operator on its own timer.
    return _number(env, name, default, minimum=0.1)


def _resources(env: Mapping[str, str], name: str) -> dict[str, Any] | None:
    """The agents' resources, checked here: a bad quantity would otherwise fail the create of
    every attempt's pod. None: not set (the default)."""
    raw = env.get(name, "").strip()
    if not raw:
        return None
    try:
        value = json.loads(raw)
    except ValueError as e:
        raise ConfigurationError(f"{name} is not JSON ({e})") from None
    if not isinstance(value, dict) or set(value) - set(RESOURCE_SECTIONS):
        raise ConfigurationError(
            f"{name}={raw!r} must be a JSON object with only {' and '.join(RESOURCE_SECTIONS)}"
        )
    resources: dict[str, Any] = {}
    for section, quantities in value.items():
        if not isinstance(quantities, dict):
            raise ConfigurationError(f"{name}: {section} must be an object, got {quantities!r}")
        resources[section] = {}
        for resource, quantity in quantities.items():
            text = str(quantity)
            if isinstance(quantity, bool) or not QUANTITY.fullmatch(text):
                raise ConfigurationError(
                    f"{name}: {section}.{resource}={quantity!r} is not a Kubernetes quantity "
                    "(e.g. 100m, 512Mi)"
                )
            resources[section][resource] = text
    return resources


def _agent_settings(env: Mapping[str, str]) -> AgentSettings:
    """The injected containers' settings (TRAININGRUN_AGENT_*, TRAININGRUN_CLUSTER_DOMAIN)."""
    policy = env.get("TRAININGRUN_AGENT_PULL_POLICY") or AgentSettings.image_pull_policy
    if policy not in PULL_POLICIES:
        allowed = ", ".join(PULL_POLICIES)
        raise ConfigurationError(
            f"TRAININGRUN_AGENT_PULL_POLICY={policy!r} must be one of {allowed}"
        )
    metrics = env.get("TRAININGRUN_AGENT_METRICS") or AgentSettings.metrics
    if metrics not in METRICS_MODES:
        raise ConfigurationError(
            f"TRAININGRUN_AGENT_METRICS={metrics!r} must be one of {', '.join(METRICS_MODES)}"
        )
    domain = (env.get("TRAININGRUN_CLUSTER_DOMAIN") or AgentSettings.cluster_domain).lower()
    if not DNS_DOMAIN.fullmatch(domain):
        raise ConfigurationError(
            f"TRAININGRUN_CLUSTER_DOMAIN={domain!r} is not a DNS domain: give the "
            "kubelet's --cluster-domain, such as cluster.local"
        )
    agent = AgentSettings(
        image=env.get("TRAININGRUN_AGENT_IMAGE") or AgentSettings.image,
        cluster_domain=domain,
        image_pull_policy=policy,
        metrics=metrics,
        access_denied_seconds=int(
            _number(
                env,
                "TRAININGRUN_AGENT_ACCESS_DENIED_SECONDS",
                AgentSettings.access_denied_seconds,
                minimum=1,
                whole=True,
            )
        ),
        # The sidecars publish progress as often as the operator reads it, no more.
        progress_seconds=_seconds(
            env, "TRAININGRUN_PROGRESS_REFRESH_SECONDS", AgentSettings.progress_seconds
        ),
    )
    resources = _resources(env, "TRAININGRUN_AGENT_RESOURCES")
    if resources is not None:
        agent = dataclasses.replace(agent, resources=resources)
    return agent
