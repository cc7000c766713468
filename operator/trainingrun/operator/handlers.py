"""The kopf wiring, and nothing else: at start it builds the operator's parts and keeps them in
kopf's ``memo``; each watch event updates a cache and hands a pass of the run it concerns to the
scheduler. ``trainingrun operator`` imports this module to register the handlers.

Every trigger (a TrainingRun event, an event of one of its pods, a node going NotReady, gone or
tainted with a notice, a periodic tick) leads to one ``Reconciler.reconcile(namespace, name)``
on a worker thread; see ``trainingrun.operator.reconciler``.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from typing import Any

import kopf
from prometheus_client import REGISTRY

from trainingrun import api
from trainingrun.contract import LABEL_RUN
from trainingrun.operator import kubeconn
from trainingrun.operator.buckets import RunStores
from trainingrun.operator.events import EventPoster
from trainingrun.operator.kube import Kube, load_config
from trainingrun.operator.metrics import OperatorMetrics
from trainingrun.operator.reconciler import Reconciler
from trainingrun.operator.scheduler import Scheduler
from trainingrun.operator.settings import OperatorSettings

log = logging.getLogger("trainingrun.operator")


class Operator:
    """The operator's parts, wired: the reconciler, the scheduler that runs its passes, and the
    Event poster. The only place that knows all of them."""

    def __init__(self, kube: Kube, settings: OperatorSettings) -> None:
        self.metrics = OperatorMetrics(REGISTRY)
        kube.rest.on_call = self.metrics.count_api_call
        self.events = EventPoster(kube, self.metrics)
        # One namespace's custom endpoints hold at most half the workers: the others' runs are
        # served whatever that namespace's endpoints do.
        stores = RunStores(
            kube,
            settings.secret_ttl_seconds,
            on_call=self.metrics.count_bucket_call,
            max_per_namespace=max(1, settings.workers // 2),
        )
        self.reconciler = Reconciler(kube, stores, self.events, self.metrics, settings)
        self.metrics.count_runs_with(self.reconciler.view.phases)
        self.metrics.count_lingering_with(self.reconciler.old_pods.lingering)
        if settings.run_metrics:
            runs, keep = (
                self.reconciler.view.runs.values,
                settings.run_metrics_keep_finished_seconds,
            )
            self.metrics.export_runs_with(runs, keep)
        self.scheduler = Scheduler(
            self.run_pass,
            self.reconciler.view.runs.keys,
            settings.resync_seconds,
            workers=settings.workers,
            resync_rate=settings.resync_rate,
        )

    def start(self) -> None:
        self.events.start()
        self.scheduler.start()

    def stop(self) -> None:
        self.scheduler.stop()
        self.events.flush(timeout=5.0)
        self.events.stop()

    def run_pass(self, namespace: str, name: str) -> None:
        """One reconcile of a run on a worker; a pass that raises is retried after the resync
        interval, and a pass that asks for another is planned."""
        try:
            again = self.reconciler.reconcile(namespace, name)
        except Exception:
            log.exception(
                "%s/%s: reconcile failed; retrying after the resync interval", namespace, name
            )
            again = self.reconciler.settings.resync_seconds
            self.metrics.pass_errors.inc()
        if again is not None:  # 0.0: at once (the next step is due)
            self.scheduler.later(again, (namespace, name))

    def enqueue(self, namespace: str, name: str) -> None:
        """Hands a pass to the scheduler's workers: kopf's threads only record what they saw."""
        self.scheduler.later(0.0, (namespace, name))


class _NoDiffBase(kopf.DiffBaseStorage):
    """kopf keeps a deep copy of every object's "essence" to find what changed for on.create,
    on.update and on.field handlers, and builds one for every watch event even without such
    handlers. The operator has only on.event handlers: the copy is CPU spent for nothing."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return kopf.BodyEssence()

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        return None


@kopf.on.login()
def _login(**_: Any) -> kopf.ConnectionInfo:
    """kopf's watches sign in as the operator's own calls do (``trainingrun.operator.kubeconn``);
    kopf
    asks again when the API server refuses a token that has expired."""
    conn = kubeconn.load()
    return kopf.ConnectionInfo(
        server=conn.server,
        ca_data=conn.ca_pem,
        insecure=conn.insecure,
        certificate_path=conn.cert_file,
        private_key_path=conn.key_file,
        certificate_data=conn.cert_pem,
        private_key_data=conn.key_pem,
        token=conn.bearer.current() if conn.bearer else None,
        default_namespace=conn.namespace,
        proxy_url=conn.proxy,
    )


@kopf.on.startup()
def _startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.posting.enabled = False  # Events are posted by Kube.event, after the status write
    settings.persistence.diffbase_storage = _NoDiffBase()
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.execution.max_workers = 2  # only node changes call the API from a handler
    # kopf keeps a task per object for this long after its last event, and that task holds the
    # event (a parsed pod is ~30 KB): after a burst over 1000 objects, tens of MB for nothing.
    settings.queueing.idle_timeout = 0.5
    # Read and validated once by `trainingrun operator` before kopf starts.
    op_settings: OperatorSettings = memo.settings
    operator = Operator(Kube(load_config()), op_settings)
    # kopf wraps each event's object in views that refer to each other: a reference cycle per
    # event that keeps the parsed object (~30 KB for a pod) until the cycle collector frees it.
    # In a burst they outlive the young generations, and CPython collects the oldest only once
    # it grew by a quarter, counting the ~200k objects of the imported modules: a burst over
    # 1000 objects then held ~100 MB. Frozen, the modules no longer count (the collection after
    # the freeze resets the count), and full collections follow the operator's own garbage.
    gc.collect()
    gc.freeze()
    gc.collect()
    operator.start()
    memo.operator = operator


@kopf.on.cleanup()
def _cleanup(memo: kopf.Memo, **_: Any) -> None:
    operator: Operator | None = getattr(memo, "operator", None)
    if operator is not None:
        operator.stop()


# The handlers are coroutines: they only update a cache and hand a pass to the scheduler, which
# takes microseconds, so they run on kopf's event loop instead of a hop through its thread pool.


@kopf.on.event(api.GROUP, api.VERSION, api.PLURAL)
async def _on_run(
    type: str, body: kopf.Body, namespace: str | None, name: str, memo: kopf.Memo, **_: Any
) -> None:
    operator: Operator = memo.operator
    if not namespace:
        return
    if type == "DELETED":
        operator.reconciler.forget(namespace, name)
        return
    runs = operator.reconciler.view.runs
    if runs.seen((namespace, name), body):
        return  # the echo of the operator's own status write: nothing new
    runs.put((namespace, name), body)
    operator.enqueue(namespace, name)


@kopf.on.event("", "v1", "pods", labels={LABEL_RUN: kopf.PRESENT})
async def _on_pod(
    type: str, body: kopf.Body, namespace: str | None, memo: kopf.Memo, **_: Any
) -> None:
    operator: Operator = memo.operator
    run = body["metadata"]["labels"][LABEL_RUN]
    if not namespace:
        return
    key = (namespace, body["metadata"]["name"])
    pods = operator.reconciler.view.pods
    if type == "DELETED":
        pods.gone(key, body)
    else:
        if pods.seen(key, body):
            return  # the echo of the operator's own create: the pass that made it saw it
        pods.put(key, body)
    if operator.reconciler.view.is_old_attempt(namespace, run, body):
        return  # the run has moved on to a newer attempt
    operator.enqueue(namespace, run)


@kopf.on.event("", "v1", "nodes")
async def _on_node(type: str, body: kopf.Body, name: str, memo: kopf.Memo, **_: Any) -> None:
    operator: Operator = memo.operator
    nodes, notices = operator.reconciler.view.nodes, operator.reconciler.notices
    node = None if type == "DELETED" else body
    if node is None:
        nodes.gone(name, body)
    else:
        nodes.put(name, node)
    if not notices.node_matters(node):
        return
    # The run pods on the node from the pod cache (no list across namespaces); annotating them
    # calls the API: off the event loop.
    pods = operator.reconciler.view.pods_on_node(name)
    for namespace, run in await asyncio.to_thread(notices.node_changed, node, pods):
        operator.enqueue(namespace, run)
