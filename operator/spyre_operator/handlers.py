"""The kopf layer: watches, indices and routing. Thin by design.

Event handlers are ``async`` on purpose: kopf runs sync handlers in a thread pool, and the
work queue is an asyncio structure owned by the event loop.

Index handlers keep slim copies of SpyreModels and their children in memory; event handlers
only route each event to the SpyreModels it concerns; all decisions happen in
``control.controller.Controller`` / ``decide.decide``. No change-detection handlers are used, so
kopf itself writes nothing to the objects (its bookkeeping storage is still configured under
the group's annotation prefix for any future handler).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import os
import threading
from collections import Counter
from dataclasses import dataclass
from typing import Any

import kopf
from lightkube import AsyncClient, KubeConfig
from lightkube.resources.discovery_v1 import EndpointSlice
from pydantic import ValidationError

from . import FIELD_MANAGER, GROUP, KIND, PLURAL, VERSION
from .api.v1alpha1 import CacheVolumeSpec, SpyreModelSpec
from .control import peers
from .control.budgets import DEFAULT_MAX_CONCURRENT_COMPILES, DEFAULT_MAX_CONCURRENT_ROLLOUTS
from .control.controller import Caches, Controller
from .control.optional import DEFAULT_RECHECK_SECONDS, OptionalApiWatch
from .control.resync import DEFAULT_PERIOD_SECONDS, PAGE_SIZE, Resync
from .decide import DEFAULT_POLICY, Policy, ScaleToZeroConfig, deployment_rolling, jobs
from .desired import names
from .desired.inference_pool import InferencePool, inference_pool_name
from .desired.plan import OwnerRef, plan_model
from .desired.scaletozero import HTTPScaledObject, ScaledObject
from .desired.site import SiteDefaults
from .kube.apply import STATUS_FIELDS_KEY, status_fields_owned
from .runtime.coldstart import start_coldstart_server
from .runtime.metrics import counting_client, start_metrics_server
from .runtime.metrics_auth import MetricsAuth

log = logging.getLogger(__name__)

MANAGED = {names.MANAGED_BY: names.MANAGED_BY_VALUE}
INDEX_NAMES = (
    "models",
    "artifact_users",
    "claim_users",
    "model_claim_users",
    "jobs",
    "claim_jobs",
    "owned_jobs",
    "deployments",
    "services",
    "pdbs",
    "hpas",
    "networkpolicies",
    "configmaps",
    "pvcs",
    "endpointslices",
    "child_names",
)


@dataclass(frozen=True)
class ClaimUser:
    """A SpyreModel using a cache claim; ``volume`` is set when the operator manages it."""

    owner: OwnerRef
    volume: CacheVolumeSpec | None
    #: creationTimestamp: the oldest user's cache.volume settings make a shared PVC.
    created: str = ""


class OperatorConfig:
    """Process-wide settings from the CLI (set before kopf starts)."""

    workers: int = 32
    metrics_port: int | None = None
    #: Who may read /metrics: anyone ("none") or a token allowed by RBAC ("kubernetes").
    metrics_auth: str = "none"
    #: A directory with tls.crt and tls.key: /metrics over HTTPS.
    metrics_tls_dir: str | None = None
    leader_election: bool = True
    leader_election_namespace: str | None = None
    #: The Lease's name: one per install (the chart passes its release's full name).
    leader_election_lease: str = "spyre-model-operator"
    identity: str = "spyre-model-operator"
    #: Watched namespaces; empty: all namespaces.
    namespaces: list[str] = []  # noqa: RUF012 - process-wide settings
    #: Scale to zero: where KEDA's scaler, the interceptor, Prometheus and the cold-start
    #: responder's Service are (cli.py flags).
    scale_to_zero: ScaleToZeroConfig = ScaleToZeroConfig()
    #: The port the cold-start responder listens on (None: not served).
    coldstart_port: int | None = None
    #: Cluster-wide defaults of per-site SpyreModel fields and the engine-image allow-list.
    site: SiteDefaults = SiteDefaults()
    #: Cluster-wide budgets (control/budgets.py): precompile Jobs and serving rollouts at once
    #: (0: any).
    max_concurrent_compiles: int = DEFAULT_MAX_CONCURRENT_COMPILES
    max_concurrent_rollouts: int = DEFAULT_MAX_CONCURRENT_ROLLOUTS
    #: The most of each one namespace may hold (0: no cap; the fair share applies anyway).
    compiles_per_namespace: int = 0
    rollouts_per_namespace: int = 0


def slim(body: Any) -> dict[str, Any]:
    """A plain-dict copy of an object without managedFields (they are large and unused)."""
    raw = dict(body)
    meta = dict(raw.get("metadata") or {})
    meta.pop("managedFields", None)
    raw["metadata"] = meta
    return raw


def _plan(body: Any) -> Any:
    meta = body.get("metadata", {})
    if meta.get("deletionTimestamp"):
        return None
    generation = meta.get("generation")
    if generation is None:
        return _build_plan(meta["namespace"], meta["name"], meta.get("uid", ""), body.get("spec"))
    key = (meta["namespace"], meta["name"], meta.get("uid", ""), generation)
    # The spec changes only with the generation, and every event on a model (status writes
    # included) runs two index handlers: validate and hash once per generation. Index
    # handlers run in kopf's thread pool, hence the lock.
    with _plans_lock:
        if key in _plans:
            return _plans[key]
    plan = _build_plan(*key[:3], body.get("spec"))
    with _plans_lock:
        if len(_plans) >= PLAN_CACHE_SIZE:
            _plans.pop(next(iter(_plans)))
        _plans[key] = plan
    return plan


PLAN_CACHE_SIZE = 4096
_plans: dict[tuple[str, str, str, int], Any] = {}
_plans_lock = threading.Lock()


def _build_plan(namespace: str, name: str, uid: str, spec_body: Any) -> Any:
    try:
        spec = SpyreModelSpec.model_validate(dict(spec_body or {}))
    except ValidationError:
        return None
    return plan_model(name, namespace, uid, spec, OperatorConfig.site)


def api_clients(requests: Counter[tuple[str, str]], config: KubeConfig | None = None,
                timeout: float = 30) -> tuple[AsyncClient, AsyncClient]:
    """The reconcile's client (HTTP/2 when available; its requests counted in ``requests`` by
    verb and resource) and the client of the operator's own long watches (HTTP/1.1).

    Two clients, because on one HTTP/2 connection an open watch (no read timeout) holds the
    connection's read side: a request sent beside it then waits for its answer past its own
    read timeout (httpcore 2.16; a status PATCH once hung the reconcile for good).
    tests/unit/test_watch_client.py reproduces it with a local HTTP/2 server.
    """
    client = counting_client(requests, config=config, field_manager=FIELD_MANAGER,
                             timeout=timeout, http2=use_http2())
    watch_client = AsyncClient(config=config, field_manager=FIELD_MANAGER, timeout=timeout,
                               http2=False)
    return client, watch_client


def use_http2() -> bool:
    """HTTP/2 to the API server when the h2 package is installed (SPYRE_HTTP2=0 turns it off).

    With HTTP/1.1 every concurrent request needs its own TLS connection and httpx keeps only
    20 alive, so bursts of concurrent reconciles paid a TLS handshake per request; HTTP/2
    multiplexes them over one connection (see tests/bench/RESULTS.md).
    """
    if os.environ.get("SPYRE_HTTP2", "1") == "0":
        return False
    return importlib.util.find_spec("h2") is not None


def policy_from_env(env: Any) -> Policy:
    """Reconcile tunables: SPYRE_COMPILE_RETRY_BASE_SECONDS / _MAX_SECONDS (compile retries),
    SPYRE_GC_INTERVAL_SECONDS (how often a cache claim's artifacts are evaluated for GC),
    SPYRE_SCHEDULER_SILENCE_SECONDS (how long serving pods wait for a scheduler's look before
    the model says SchedulerNotRunning); POD_NAMESPACE (the chart's: the operator's own
    namespace, admitted by a canary model's NetworkPolicy)."""
    return Policy(
        retry_base_seconds=float(env.get("SPYRE_COMPILE_RETRY_BASE_SECONDS", 60)),
        retry_cap_seconds=float(env.get("SPYRE_COMPILE_RETRY_MAX_SECONDS", 3600)),
        gc_interval_seconds=float(
            env.get("SPYRE_GC_INTERVAL_SECONDS", DEFAULT_POLICY.gc_interval_seconds)
        ),
        scheduler_silence_seconds=float(env.get(
            "SPYRE_SCHEDULER_SILENCE_SECONDS", DEFAULT_POLICY.scheduler_silence_seconds)),
        operator_namespace=env.get("POD_NAMESPACE") or None,
    )


# ------------------------------------------------------------------------------ settings


def in_cluster_server(env: Any) -> str | None:
    """The API server as client-go's in-cluster config finds it: the Service's IP and port."""
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        return None
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """In a pod, log in with the service account at KUBERNETES_SERVICE_HOST:PORT; else use the
    kubeconfig.

    kopf's own service-account login connects to https://kubernetes.default.svc, which needs
    cluster DNS: without it the operator took its Lease (lightkube uses the IP) and passed its
    liveness probe while never watching anything (found on the local cluster, which has no
    DNS). lightkube and client-go use the Service's IP from the environment; so does this.
    """
    info = kopf.login_with_service_account(**kwargs)
    server = in_cluster_server(os.environ)
    if info is not None and server:
        return dataclasses.replace(info, server=server)
    return info or kopf.login_with_kubeconfig(**kwargs)



#: The initial list of each watched resource comes in pages of this many objects (kopf's
#: chunk_size; the whole list at once by default), as the periodic re-list's do: what the
#: operator holds while it lists is one page, not every ConfigMap or Pod of the cluster.
WATCH_PAGE_SIZE = PAGE_SIZE


def watch_selectors(settings: kopf.OperatorSettings) -> None:
    """What the API server sends the operator's watches (server-side, before any byte
    reaches it): ConfigMaps only with the operator's label (it writes one kind, a model's
    ``<model>-output-check``; a same-named one of someone else's is looked up by name before
    the first write, control/execute.py), and every initial list in pages. Without them
    every ConfigMap in the cluster, a tenant's megabyte ones included, was sent and parsed,
    and the initial list was held whole (issue 45, 2). kopf 1.45 brought both settings
    (requirements.lock pins it); an older kopf is sent every ConfigMap again, said in a
    warning (the index keeps only labelled ones either way: index_named_children)."""
    if not all(hasattr(settings.watching, a) for a in ("label_selectors", "chunk_size")):
        log.warning(
            "this kopf has no server-side watch selectors (settings.watching.label_selectors, "
            "chunk_size): every ConfigMap of the watched namespaces reaches the operator; "
            "install kopf 1.45 or later, the version requirements.lock pins"
        )
        return
    settings.watching.chunk_size = WATCH_PAGE_SIZE
    settings.watching.label_selectors["", "v1", "configmaps"] = (
        f"{names.MANAGED_BY}={names.MANAGED_BY_VALUE}"
    )


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **kwargs: Any) -> None:
    """Configure kopf, create the API client and start the reconcile workers."""
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    settings.posting.level = logging.WARNING  # our own Events mark transitions
    # The resources are known; don't scan namespaces or CRDs (that would need cluster-wide
    # list/watch rights the namespaced RBAC does not grant, and retries slow startup).
    settings.scanning.disabled = True
    # Survive API server restarts: short watch timeouts, quick reconnects.
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = 10
    settings.watching.reconnect_backoff = 1.0
    watch_selectors(settings)
    settings.networking.request_timeout = 30
    settings.batching.worker_limit = 1000
    # kopf waits this long after an event for more events on the same object; the handlers
    # only route, so a short window keeps apply -> Job latency low (default 0.1 s).
    settings.batching.batch_window = 0.02

    requests: Counter[tuple[str, str]] = Counter()
    client, watch_client = api_clients(requests)
    memo["watch_client"] = watch_client
    caches = Caches({n: kwargs[n] for n in INDEX_NAMES if n in kwargs})
    controller = Controller(
        client,
        caches,
        workers=OperatorConfig.workers,
        policy=dataclasses.replace(policy_from_env(os.environ), site=OperatorConfig.site),
        max_concurrent_compiles=OperatorConfig.max_concurrent_compiles,
        max_concurrent_rollouts=OperatorConfig.max_concurrent_rollouts,
        compiles_per_namespace=OperatorConfig.compiles_per_namespace,
        rollouts_per_namespace=OperatorConfig.rollouts_per_namespace,
    )
    controller.requests = requests
    memo["controller"] = controller
    router = controller.router
    # InferencePools: the CRD may be absent (then models asking for one say so in RoutingReady).
    pools = OptionalApiWatch(
        watch_client,
        InferencePool,
        OperatorConfig.namespaces or None,
        on_object=lambda ns, obj: controller.enqueue(router.models_for_routing_object(ns, obj)),
        on_state=lambda: controller.enqueue(router.models_wanting_routing()),
        recheck_seconds=float(
            os.environ.get("SPYRE_OPTIONAL_API_RECHECK_SECONDS", DEFAULT_RECHECK_SECONDS)
        ),
    )
    controller.inference_pools = pools
    memo["inference_pools"] = pools
    pools.start()
    if OperatorConfig.scale_to_zero.enabled:
        start_scale_to_zero_watches(controller, watch_client, memo)
    else:
        controller.scale_to_zero = OperatorConfig.scale_to_zero
    lease_namespace = OperatorConfig.leader_election_namespace or "default"
    # Every status write names this install; a model another install writes is left alone.
    controller.install = peers.install_id(lease_namespace, OperatorConfig.leader_election_lease)
    controller.identity = OperatorConfig.identity
    controller.peer_window = float(os.environ.get("SPYRE_PEER_WINDOW_SECONDS",
                                                  controller.peer_window))
    controller.start()
    # Re-list what the indices hold: nothing deleted during a watch gap stays (control/resync.py).
    resync = Resync(controller, client, OperatorConfig.namespaces or None,
                    period=float(os.environ.get("SPYRE_RESYNC_SECONDS", DEFAULT_PERIOD_SECONDS)))
    memo["resync"] = resync
    resync.start()
    if OperatorConfig.leader_election:
        from .control.leader import LeaderElector

        elector = LeaderElector(
            client,
            namespace=lease_namespace,
            identity=OperatorConfig.identity,
            on_change=controller.set_leader,
            lease_name=OperatorConfig.leader_election_lease,
        )
        controller.set_leader(False)
        controller.may_write = elector.holds
        memo["elector"] = elector
        elector.start()
    if OperatorConfig.metrics_port:
        memo["metrics"] = await start_metrics_server(
            controller, OperatorConfig.metrics_port, tls_dir=OperatorConfig.metrics_tls_dir,
            auth=MetricsAuth(client) if OperatorConfig.metrics_auth == "kubernetes" else None)
    if OperatorConfig.coldstart_port:
        memo["coldstart"] = await start_coldstart_server(
            lambda ns, name: controller.caches.one("models", (ns, name)),
            OperatorConfig.coldstart_port,
        )
    log.info("spyre-model-operator started with %d workers", OperatorConfig.workers)


def start_scale_to_zero_watches(controller: Controller, client: AsyncClient, memo: Any) -> None:
    """KEDA's ScaledObjects and the add-on's HTTPScaledObjects (their CRDs may be absent: the
    models allowing zero then say so), and the interceptor proxy's EndpointSlices (mirrored
    into each such model's Service)."""
    cfg = controller.scale_to_zero = OperatorConfig.scale_to_zero
    router = controller.router
    recheck = float(os.environ.get("SPYRE_OPTIONAL_API_RECHECK_SECONDS", DEFAULT_RECHECK_SECONDS))
    watched = (("scaled_objects", ScaledObject), ("http_scaled_objects", HTTPScaledObject))
    for key, resource in watched:
        watch = OptionalApiWatch(
            client,
            resource,
            OperatorConfig.namespaces or None,
            on_object=lambda ns, obj: controller.enqueue(
                router.models_for_owner_refs(ns, obj) + router.models_for_child_name(
                    ns, str((obj.get("metadata") or {}).get("name") or ""))),
            on_state=lambda: controller.enqueue(router.models_wanting_scale_to_zero()),
            recheck_seconds=recheck,
        )
        setattr(controller, key, watch)
        memo[key] = watch
        watch.start()
    slices = OptionalApiWatch(
        client,
        EndpointSlice,
        [cfg.interceptor_namespace],
        on_object=lambda ns, obj: controller.enqueue(router.models_for_interceptor_slice(obj)),
        on_state=lambda: controller.enqueue(router.models_wanting_scale_to_zero()),
        recheck_seconds=recheck,
    )
    controller.interceptor_slices = slices
    memo["interceptor"] = slices
    slices.start()


@kopf.on.cleanup()
async def shutdown(memo: kopf.Memo, **_: Any) -> None:
    """Stop workers, the leader elector and the metrics server."""
    if "elector" in memo:
        await memo["elector"].stop()
    if "resync" in memo:
        await memo["resync"].stop()
    for watch in ("inference_pools", "scaled_objects", "http_scaled_objects", "interceptor"):
        if watch in memo:
            await memo[watch].stop()
    if "controller" in memo:
        await memo["controller"].stop()
    for server in ("metrics", "coldstart"):
        if server in memo:
            await memo[server].cleanup()


# ------------------------------------------------------------------------------ indices


@kopf.index(GROUP, VERSION, PLURAL, id="models")
def index_models(namespace: str, name: str, body: kopf.Body, **_: Any) -> dict[Any, Any]:
    model = slim(body)
    model[STATUS_FIELDS_KEY] = status_fields_owned(body.get("metadata") or {})
    return {(namespace, name): model}


@kopf.index(GROUP, VERSION, PLURAL, id="artifact_users")
def index_artifact_users(body: kopf.Body, **_: Any) -> dict[Any, Any]:
    plan = _plan(body)
    if plan is None:
        return {}
    return {(plan.namespace, plan.claim, plan.key): plan.owner}


@kopf.index(GROUP, VERSION, PLURAL, id="claim_users")
def index_claim_users(body: kopf.Body, **_: Any) -> dict[Any, Any]:
    plan = _plan(body)
    if plan is None:
        return {}
    volume = plan.volume if plan.claim_managed else None
    created = str(body.get("metadata", {}).get("creationTimestamp") or "")
    return {(plan.namespace, plan.claim): ClaimUser(plan.owner, volume, created)}


@kopf.index(GROUP, VERSION, PLURAL, id="model_claim_users")
def index_model_claim_users(body: kopf.Body, **_: Any) -> dict[Any, Any]:
    """SpyreModels loading weights from a pvc:// claim, by that claim."""
    plan = _plan(body)
    if plan is None or plan.model_claim is None:
        return {}
    return {(plan.namespace, plan.model_claim): plan.owner}


def child_names(model: str) -> set[str]:
    """The names of a SpyreModel's children that a same-named foreign object can take:
    derived from the model's name (equal to it only for short DNS-1035 names)."""
    return {
        names.server_name(model),
        names.engine_service_name(model),
        names.coldstart_service_name(model),
        names.mirror_slice_name(model),
        inference_pool_name(model),
    }


@kopf.index(GROUP, VERSION, PLURAL, id="child_names")
def index_child_names(namespace: str, name: str, **_: Any) -> dict[Any, Any]:
    """SpyreModels by their children's names: an event of a foreign object of such a name
    (it appeared, changed, went) wakes the model it conflicts with (NameConflict)."""
    return {(namespace, child): name for child in child_names(name)}


@kopf.index("batch", "v1", "jobs", labels=MANAGED, id="claim_jobs")
def index_claim_jobs(namespace: str, body: kopf.Body, **_: Any) -> dict[Any, Any]:
    """The operator's Jobs (precompile and GC) by (namespace, cache claim)."""
    claim = ((body.get("metadata") or {}).get("labels") or {}).get(names.CLAIM_LABEL)
    return {(namespace, claim): slim(body)} if claim else {}


@kopf.index("batch", "v1", "jobs", labels=MANAGED, id="owned_jobs")
def index_owned_jobs(namespace: str, body: kopf.Body, **_: Any) -> dict[Any, Any]:
    """Precompile Jobs by (namespace, each SpyreModel named in their ownerReferences): a
    model stops the Jobs an earlier spec of its left running (controller._observe_jobs)."""
    meta = body.get("metadata") or {}
    if (meta.get("labels") or {}).get(names.COMPONENT) != names.COMPONENT_PRECOMPILE:
        return {}
    refs = [r for r in meta.get("ownerReferences") or [] if r.get("kind") == "SpyreModel"]
    return {(namespace, r.get("name")): slim(body) for r in refs}


@kopf.index("batch", "v1", "jobs", labels=MANAGED, id="jobs")
@kopf.index("", "v1", "persistentvolumeclaims", id="pvcs")
def index_by_name(namespace: str, name: str, body: kopf.Body, **_: Any) -> dict[Any, Any]:
    """Children (and every PVC, for existing cache claims) by (namespace, name)."""
    return {(namespace, name): slim(body)}


@kopf.index("apps", "v1", "deployments", id="deployments")
@kopf.index("", "v1", "services", id="services")
@kopf.index("policy", "v1", "poddisruptionbudgets", id="pdbs")
@kopf.index("autoscaling", "v2", "horizontalpodautoscalers", id="hpas")
@kopf.index("networking.k8s.io", "v1", "networkpolicies", id="networkpolicies")
@kopf.index("", "v1", "configmaps", id="configmaps")
def index_named_children(
    namespace: str, name: str, body: kopf.Body, **_: Any
) -> dict[Any, Any]:
    """Deployments, Services, PDBs, HPAs, NetworkPolicies and ConfigMaps by (namespace, name):
    the operator's in full, others as a stub (name, labels, ownerReferences).

    A same-named object that is not the operator's must be seen before the first write, so it
    is reported and never taken over. Indexing all of them (kopf receives their events anyway:
    it filters labels on its side) costs memory for stubs instead of a GET per child and model.
    ConfigMaps are the exception: the API server sends only the operator-labelled ones
    (watch_selectors), and a same-named one of someone else's is looked up by name before the
    first write (control/execute.py).
    """
    labels = (body.get("metadata") or {}).get("labels") or {}
    if body.get("kind") == "ConfigMap" and labels.get(names.MANAGED_BY) != names.MANAGED_BY_VALUE:
        return {}  # what the re-list asks for too (an older kopf still sends them)
    if labels.get(names.MANAGED_BY) == names.MANAGED_BY_VALUE and (
            body.get("kind") != "ConfigMap" or _own_configmap(body)):
        return {(namespace, name): slim(body)}
    meta = body.get("metadata") or {}
    stub = {k: meta.get(k) for k in ("name", "namespace", "uid", "labels", "ownerReferences")}
    return {(namespace, name): {"kind": body.get("kind"), "metadata": stub}}


def _own_configmap(body: Any) -> bool:
    """A model's ``<model>-output-check``, owned by that model: the only ConfigMap the
    operator writes. Any other that carries the operator's label (the only ones the API
    server sends it) is kept as a stub: a tenant's megabyte ConfigMaps with the operator's
    labels were kept whole (issue 45, 2)."""
    meta = body.get("metadata") or {}
    return any(
        r.get("kind") == KIND and meta.get("name") == names.verified_name(str(r.get("name")))
        for r in meta.get("ownerReferences") or []
    )


# ------------------------------------------------------------------------------ routing


def _controller(memo: kopf.Memo) -> Controller:
    return memo["controller"]  # type: ignore[no-any-return]


@kopf.on.event(GROUP, VERSION, PLURAL)
async def on_model(
    type: str | None, namespace: str, name: str, body: kopf.Body, memo: kopf.Memo, **_: Any
) -> None:
    """A SpyreModel changed: reconcile it, and its cache-claim peers if it left or changed."""
    c = _controller(memo)
    key = (namespace, name)
    plan = None if type == "DELETED" else _plan(body)
    c.enqueue([key], urgent=not body.get("status"))  # new: its Job is what users wait for
    c.enqueue(c.router.claim_peers_if_changed(key, plan))


@kopf.on.event("batch", "v1", "jobs", labels=MANAGED)
@kopf.on.event("apps", "v1", "deployments", labels=MANAGED)
@kopf.on.event("", "v1", "services", labels=MANAGED)
@kopf.on.event("policy", "v1", "poddisruptionbudgets", labels=MANAGED)
@kopf.on.event("autoscaling", "v2", "horizontalpodautoscalers", labels=MANAGED)
@kopf.on.event("networking.k8s.io", "v1", "networkpolicies", labels=MANAGED)
@kopf.on.event("", "v1", "configmaps", labels=MANAGED)
async def on_child(
    type: str | None, namespace: str, body: kopf.Body, memo: kopf.Memo, **_: Any
) -> None:
    """A child changed: reconcile the SpyreModels that own it (and, when a precompile Job
    finished or went, or a rollout completed, the models waiting for that budget's slot)."""
    c = _controller(memo)
    # a Job that just finished: the Deployment is what users wait for
    finished = body.get("kind") == "Job" and jobs.finished(body)
    c.enqueue(c.router.models_for_owner_refs(namespace, body), urgent=finished)
    if body.get("kind") == "Job" and (finished or type == "DELETED"):
        c.budgets.wake_compile_waiters()
    elif body.get("kind") == "Deployment" and (type == "DELETED" or not deployment_rolling(body)):
        c.budgets.wake_rollout_waiters()


_MIRROR_SLICES_REGISTERED: list[bool] = []


def register_mirror_slice_handlers() -> None:
    """With scale to zero on, and only then, the mirror EndpointSlices the operator writes
    (a scale-to-zero model's Service -> the interceptor) are indexed and watched like its
    other children: the chart grants EndpointSlice rights only with ``scaleToZero.enabled``
    (issue 45, 3), and a kopf watch it may not list would stop the operator. Called by
    ``spyre-operator run`` before kopf starts; once."""
    if _MIRROR_SLICES_REGISTERED:
        return
    _MIRROR_SLICES_REGISTERED.append(True)
    kopf.index("discovery.k8s.io", "v1", "endpointslices", labels=MANAGED,
               id="endpointslices")(index_by_name)  # fmt: skip
    kopf.on.event("discovery.k8s.io", "v1", "endpointslices", labels=MANAGED)(on_child)


@kopf.on.event("apps", "v1", "deployments", labels={names.MANAGED_BY: kopf.ABSENT})
@kopf.on.event("", "v1", "services", labels={names.MANAGED_BY: kopf.ABSENT})
@kopf.on.event("policy", "v1", "poddisruptionbudgets", labels={names.MANAGED_BY: kopf.ABSENT})
@kopf.on.event(
    "autoscaling", "v2", "horizontalpodautoscalers", labels={names.MANAGED_BY: kopf.ABSENT}
)
@kopf.on.event("networking.k8s.io", "v1", "networkpolicies", labels={names.MANAGED_BY: kopf.ABSENT})
async def on_foreign_child(namespace: str, name: str, memo: kopf.Memo, **_: Any) -> None:
    """A same-named object that is not ours appeared, changed or went: re-check the model."""
    c = _controller(memo)
    c.enqueue(c.router.models_for_child_name(namespace, name))


@kopf.on.event("", "v1", "persistentvolumeclaims")
async def on_pvc(
    type: str | None, namespace: str, name: str, body: kopf.Body, memo: kopf.Memo, **_: Any
) -> None:
    """A PVC changed: reconcile the SpyreModels caching on it (one of them if only drift)."""
    c = _controller(memo)
    phase = None if type == "DELETED" else (body.get("status") or {}).get("phase") or "Pending"
    if phase is not None and (body.get("metadata") or {}).get("deletionTimestamp"):
        phase = "Terminating"  # every user's CacheVolumeReady changes (ClaimTerminating)
    c.enqueue(c.router.models_for_pvc_event(namespace, name, phase))
    c.enqueue(c.router.models_for_model_claim(namespace, name))
