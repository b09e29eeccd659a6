"""Scale to zero with KEDA and its HTTP add-on: the objects a model with ``minReplicas: 0``
needs (pure: spec in, typed objects out).

The design is operator/SCALE-TO-ZERO.md (KEDA v2.21.0, HTTP add-on v0.12.0):

* ``<model>-engine``: a Service selecting the model's serving pods on ``serving.port``, the
  address the add-on's interceptor forwards to (``scaleTargetRef.service``) and whose
  EndpointSlices it watches to know when a held request can go.
* an ``HTTPScaledObject`` named like the model's Service: the interceptor's route for the
  Service's host names, its per-route timeouts and the cold-start failover (our responder's
  503 + Retry-After). Annotated ``skip-scaledobject-creation`` from the start (the add-on
  ignores an annotation-only change later), so the add-on writes no ScaledObject.
* a KEDA ``ScaledObject`` named like the model, written by us: the single writer of the
  SpyreModel's ``/scale``. Its ``external-push`` trigger (the add-on's scaler) wakes the model
  on a held request and keeps it up while requests arrive; one ``prometheus`` trigger per
  autoscaling target drives 1..N exactly as today's HPA does (``autoscaling.py``).

The cluster-specific addresses (scaler, Prometheus, cold-start responder) are arguments: they
come from the operator's configuration, not from the SpyreModel.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from lightkube.generic_resource import create_namespaced_resource
from lightkube.models.core_v1 import ServicePort, ServiceSpec
from lightkube.models.discovery_v1 import Endpoint, EndpointConditions, EndpointPort
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Service
from lightkube.resources.discovery_v1 import EndpointSlice

from .. import KIND
from ..api.v1alpha1 import AutoscalingSpec, ScaleToZeroSpec
from . import names
from .autoscaling import (
    KV_CACHE_METRIC,
    QUEUE_METRIC,
    RUNNING_METRIC,
    hpa_behavior,
    targets,
)
from .deployment import PORT_NAME
from .owners import API_VERSION, controller_ref
from .plan import ModelPlan
from .service import serving_ports

HTTP_GROUP = "http.keda.sh"
HTTP_VERSION = "v1alpha1"
HTTP_SCALED_OBJECT_KIND = "HTTPScaledObject"
HTTP_SCALED_OBJECT_PLURAL = "httpscaledobjects"

KEDA_GROUP = "keda.sh"
KEDA_VERSION = "v1alpha1"
SCALED_OBJECT_KIND = "ScaledObject"
SCALED_OBJECT_PLURAL = "scaledobjects"

HTTPScaledObject = create_namespaced_resource(
    HTTP_GROUP, HTTP_VERSION, HTTP_SCALED_OBJECT_KIND, HTTP_SCALED_OBJECT_PLURAL
)
ScaledObject = create_namespaced_resource(
    KEDA_GROUP, KEDA_VERSION, SCALED_OBJECT_KIND, SCALED_OBJECT_PLURAL
)

#: The add-on writes no ScaledObject for an HTTPScaledObject carrying this (we write our own,
#: with the Prometheus triggers); H/operator/controllers/http/app.go.
SKIP_SCALED_OBJECT_ANNOTATION = "httpscaledobject.keda.sh/skip-scaledobject-creation"

#: The HTTP trigger's idle signal is the request *rate* over a short window, not the number of
#: requests in flight: the add-on's scaler samples the interceptor every 500 ms
#: (KEDA_HTTP_QUEUE_TICK_DURATION), so a trickle of requests shorter than that is seen as no
#: requests at all, and the model went to zero under steady use. Any arrival keeps the rate
#: above zero for the whole window (the scaler reports ceil(rate), H/scaler/handlers.go),
#: so "idle" is idleSeconds (KEDA's cooldown) plus at most this window without an arrival.
HTTP_RATE_WINDOW = "10s"
HTTP_RATE_GRANULARITY = "1s"
#: Requests per second per replica the HTTP trigger aims at. KEDA's HPA takes the largest
#: replica count any trigger asks for; with this target the HTTP trigger never asks for more
#: than one (ceil(rate / 1e6)), so 0 -> 1 and the idle decision are its job and 1..N belongs
#: to the engine's metrics (the Prometheus triggers), as with today's HPA.
HTTP_RATE_TARGET = 1_000_000

#: With Prometheus, one more trigger keeps a model with requests running up (a long stream
#: makes no new arrival): activation only, its threshold never asks for a second replica.
IN_FLIGHT_TRIGGER = "requests-in-flight"
IN_FLIGHT_SERIES = "vllm:num_requests_running"

#: The trigger that keeps a model active while it starts (:func:`starting_trigger`).
STARTING_TRIGGER = "model-starting"

#: The ScaledObject's external-push trigger type and its metadata keys (what the add-on's own
#: operator writes, H/pkg/k8s/scaledobject.go).
EXTERNAL_PUSH = "external-push"

#: The Prometheus label that carries the model (``names.MODEL_LABEL`` on the pod): the chart's
#: PodMonitor copies it as a pod target label (``podTargetLabels``), sanitised by Prometheus.
PROMETHEUS_MODEL_LABEL = "serving_spyre_dev_model"

#: The engine's Prometheus series behind each of the HPA's custom metrics (prometheus-adapter
#: renames ``vllm:X`` to ``vllm_X``), and the trigger's name.
_SERIES: dict[str, tuple[str, str]] = {
    QUEUE_METRIC: ("vllm:num_requests_waiting", "queue-length"),
    KV_CACHE_METRIC: ("vllm:kv_cache_usage_perc", "kv-cache-usage"),
    RUNNING_METRIC: ("vllm:num_requests_running", "running-requests"),
}


def wants_scale_to_zero(plan: ModelPlan) -> bool:
    """Whether the model may go to zero replicas (``autoscaling.minReplicas: 0``)."""
    auto = plan.spec.autoscaling
    return auto is not None and auto.min_replicas == 0


def scale_to_zero_settings(auto: AutoscalingSpec) -> ScaleToZeroSpec:
    """``autoscaling.scaleToZero``, or its defaults when left out."""
    return auto.scale_to_zero if auto.scale_to_zero is not None else ScaleToZeroSpec()


def _meta(plan: ModelPlan, name: str, annotations: dict[str, str] | None = None) -> ObjectMeta:
    return ObjectMeta(
        name=name,
        namespace=plan.namespace,
        labels={
            **names.common_labels(names.COMPONENT_SERVER),
            names.MODEL_LABEL: names.model_label_value(plan.name),
        },
        annotations=annotations,
        ownerReferences=[controller_ref(plan.owner)],
    )


def _auto(plan: ModelPlan) -> AutoscalingSpec:
    auto = plan.spec.autoscaling
    assert auto is not None and auto.min_replicas == 0, "not a scale-to-zero model"
    return auto


def build_engine_service(plan: ModelPlan) -> Service:
    """``<model>-engine``: the serving pods on serving.port, what the interceptor forwards to.

    The same selector and port as the model's own Service (service.py), which then points at
    the interceptor so that every request is counted (the idle signal).
    """
    return Service(
        metadata=_meta(plan, names.engine_service_name(plan.name)),
        spec=ServiceSpec(
            type="ClusterIP",
            selector=names.server_selector(plan.name),
            ports=serving_ports(plan),
        ),
    )


def build_interceptor_service(plan: ModelPlan) -> Service:
    """The model's own Service (``status.endpoint``) while zero is allowed: the same name,
    ClusterIP and port, but no selector. Its endpoints are the interceptor's, which the
    operator mirrors into an EndpointSlice (build_mirror_slice), so every request passes the
    interceptor (counted: the idle signal; held at zero)."""
    svc = build_engine_service(plan)
    assert svc.metadata is not None and svc.spec is not None
    svc.metadata.name = names.server_name(plan.name)
    svc.spec.selector = None
    svc.spec.ports = [p for p in svc.spec.ports or [] if p.name == PORT_NAME]  # no metrics
    return svc


#: EndpointSlice label that tells the EndpointSlice controller the slice is not its own.
SLICE_MANAGED_BY = "endpointslice.kubernetes.io/managed-by"
SLICE_SERVICE_NAME = "kubernetes.io/service-name"
#: A label value: no "/" (the EndpointSlice controller's own is endpointslice-controller.k8s.io).
SLICE_MANAGED_BY_VALUE = "spyre-model-operator.serving.spyre.dev"


def interceptor_endpoints(
    slices: list[dict[str, Any]], port_name: str = ""
) -> tuple[list[dict[str, Any]], int | None, str]:
    """(endpoints, endpoint port, address type) of the interceptor proxy's EndpointSlices.

    The port is the slice's (the pods' port, not the Service's): the one named ``port_name``,
    else the slice's first. IPv4 slices win over IPv6 ones (one slice has one address type);
    endpoints of several slices are merged (at most 1000 endpoints fit in a slice).
    """
    by_type: dict[str, list[dict[str, Any]]] = {}
    for sl in slices:
        by_type.setdefault(str(sl.get("addressType") or "IPv4"), []).append(sl)
    address_type = "IPv4" if "IPv4" in by_type else next(iter(sorted(by_type)), "IPv4")
    endpoints: list[dict[str, Any]] = []
    port: int | None = None
    for sl in sorted(by_type.get(address_type, []), key=lambda x: x["metadata"]["name"]):
        ports = sl.get("ports") or []
        chosen = next((p for p in ports if port_name and p.get("name") == port_name), None)
        chosen = chosen or (ports[0] if ports else None)
        if chosen is None or chosen.get("port") is None:
            continue
        port = port if port is not None else int(chosen["port"])
        for ep in sl.get("endpoints") or []:
            endpoints.append(ep)
    endpoints.sort(key=lambda ep: list(ep.get("addresses") or []))
    return endpoints[:1000], port, address_type


def build_mirror_slice(
    plan: ModelPlan, endpoints: list[dict[str, Any]], port: int, address_type: str
) -> EndpointSlice:
    """The interceptor's endpoints for the model's selector-less Service: port named like the
    Service's (kube-proxy maps Service port -> endpoint port by name), number the interceptor's."""
    meta = _meta(plan, names.mirror_slice_name(plan.name))
    assert meta.labels is not None
    meta.labels[SLICE_SERVICE_NAME] = names.server_name(plan.name)
    meta.labels[SLICE_MANAGED_BY] = SLICE_MANAGED_BY_VALUE
    out = []
    for ep in endpoints:
        conds = ep.get("conditions") or {}
        out.append(
            Endpoint(
                addresses=list(ep.get("addresses") or []),
                conditions=EndpointConditions(
                    ready=conds.get("ready"),
                    serving=conds.get("serving"),
                    terminating=conds.get("terminating"),
                ),
                nodeName=ep.get("nodeName"),
                zone=ep.get("zone"),
            )
        )
    return EndpointSlice(
        metadata=meta,
        addressType=address_type,
        endpoints=out,
        ports=[EndpointPort(name=PORT_NAME, port=port, protocol="TCP", appProtocol="http")],
    )


def build_coldstart_service(plan: ModelPlan, target: str, port: int) -> Service:
    """``<model>-coldstart``: an ExternalName Service naming the operator's cold-start
    responder (``target``: its FQDN). The add-on dials the failover ref as
    ``<service>.<HTTPScaledObject namespace>:<port>``, so it must exist in the model's
    namespace; a CNAME keeps the port, which is the responder Service's own."""
    return Service(
        metadata=_meta(plan, names.coldstart_service_name(plan.name)),
        spec=ServiceSpec(
            type="ExternalName",
            externalName=target,
            ports=[ServicePort(name="http", port=port, protocol="TCP")],
        ),
    )


def http_hosts(plan: ModelPlan) -> list[str]:
    """Every Host a client in the cluster may send for the model's Service (the interceptor
    matches the Host header without its port)."""
    svc = names.server_name(plan.name)
    ns = plan.namespace
    return [svc, f"{svc}.{ns}", f"{svc}.{ns}.svc", f"{svc}.{ns}.svc.cluster.local"]


def _seconds(value: int) -> str:
    """A Go duration (metav1.Duration) of whole seconds."""
    return f"{value}s"


#: The add-on's shortest wait (seconds): a held request's answer while no replica can start.
NO_CAPACITY_WAIT_SECONDS = 1


def build_http_scaled_object(
    plan: ModelPlan,
    *,
    failover_service: str | None,
    failover_port: int | None,
    no_capacity: bool = False,
) -> Any:
    """The interceptor's route to the model, its wake-up bound and its cold-start failover.

    ``failover_service``/``failover_port``: the operator's cold-start responder, which answers
    a request held past maxWaitSeconds with 503 + Retry-After (v0.12.0's own answer is a 502
    without Retry-After). The request carries ``X-KEDA-HTTP-Cold-Start-Ref-Name`` (the
    SpyreModel) and ``-Namespace``, so the responder knows which model it is about.
    """
    auto = _auto(plan)
    s2z = scale_to_zero_settings(auto)
    # ``no_capacity``: the model's replica is known not to fit on any node (no free card):
    # a held request gets its 503 ("no Spyre card") after 1 s instead of maxWaitSeconds.
    wait = NO_CAPACITY_WAIT_SECONDS if no_capacity else s2z.max_wait_seconds
    failover = (
        {
            "coldStartTimeoutFailoverRef": {
                "service": failover_service,
                "port": failover_port,
                "timeoutSeconds": wait,
            }
        }
        if failover_service and failover_port
        else {}
    )
    return HTTPScaledObject(
        apiVersion=f"{HTTP_GROUP}/{HTTP_VERSION}",
        kind=HTTP_SCALED_OBJECT_KIND,
        metadata=_meta(
            plan, names.server_name(plan.name), {SKIP_SCALED_OBJECT_ANNOTATION: "true"}
        ),
        spec={
            "hosts": http_hosts(plan),
            "scaleTargetRef": {
                "apiVersion": API_VERSION,
                "kind": KIND,
                "name": plan.name,
                "service": names.engine_service_name(plan.name),
                "port": plan.spec.serving.port,
            },
            # Unused while skip-scaledobject-creation is set (the ScaledObject carries them);
            # kept equal so the object reads true.
            "replicas": {"min": 0, "max": auto.max_replicas},
            "scaledownPeriod": s2z.idle_seconds,
            "scalingMetric": {
                "requestRate": {
                    "targetValue": HTTP_RATE_TARGET,
                    "window": HTTP_RATE_WINDOW,
                    "granularity": HTTP_RATE_GRANULARITY,
                }
            },
            "timeouts": {
                # With a failover ref, its timeoutSeconds replaces conditionWait (v0.12.0,
                # H/interceptor/proxy_handlers.go); both say the same.
                "conditionWait": _seconds(wait),
                # The interceptor's default is 500ms: far too short for a non-streamed
                # completion, whose headers vLLM sends when it is done.
                "responseHeader": _seconds(s2z.response_timeout_seconds),
            },
            # Without a responder (none configured) v0.12.0 answers 502 past conditionWait.
            **failover,
        },
    )


def number(value: float) -> str:
    """A KEDA trigger threshold (a string the scaler parses as a float): 2 -> "2", 0.8 -> "0.8"."""
    return format(Decimal(str(value)).normalize(), "f")


def promql(plan: ModelPlan, series: str) -> str:
    """The model's total of one engine series, over its serving pods in its namespace.

    ``max by (pod, engine)`` first: a pod scraped twice (a PodMonitor and a ServiceMonitor, or
    through two Services) counts once. KEDA divides the total by the replica count
    (``metricType: AverageValue``), which is what the HPA's per-pod average target is.
    """
    selector = (
        f'namespace="{plan.namespace}",'
        f'{PROMETHEUS_MODEL_LABEL}="{names.model_label_value(plan.name)}"'
    )
    return f"sum(max by (pod, engine) ({series}{{{selector}}}))"


def prometheus_triggers(plan: ModelPlan, server_address: str) -> list[dict[str, Any]]:
    """One ``prometheus`` trigger per autoscaling target, the HPA's metric as PromQL, and the
    activation-only in-flight trigger.

    activationThreshold stays 0: any load seen keeps the model up, including requests that
    reach the pods without the interceptor (an InferencePool's Gateway) and a stream that
    outlasts the HTTP trigger's window.
    """
    triggers = []
    for metric, target in targets(_auto(plan)):
        series, trigger_name = _SERIES[metric]
        triggers.append(
            {
                "type": "prometheus",
                "name": trigger_name,
                "metricType": "AverageValue",
                "metadata": {
                    "serverAddress": server_address,
                    "query": promql(plan, series),
                    "threshold": number(target),
                },
            }
        )
    triggers.append(
        {
            "type": "prometheus",
            "name": IN_FLIGHT_TRIGGER,
            "metricType": "AverageValue",
            "metadata": {
                "serverAddress": server_address,
                "query": promql(plan, IN_FLIGHT_SERIES),
                "threshold": number(HTTP_RATE_TARGET),
                "activationThreshold": "0",
            },
        }
    )
    return triggers


def starting_trigger(starting_url: str) -> dict[str, Any]:
    """KEDA's ``metrics-api`` trigger on the operator's "is it starting" answer: activation
    only (its target, like the HTTP trigger's, never asks for a second replica).

    The add-on counts a held request once, when it arrives (the request rate), so KEDA alone
    keeps a woken model up for the rate window plus ``idleSeconds``; a load that takes longer
    (minutes, on a card) was scaled back to zero under its held requests. With this trigger the
    cooldown starts once a replica is Ready. KEDA polls it every ``pollingInterval`` (30 s).
    """
    return {
        "type": "metrics-api",
        "name": STARTING_TRIGGER,
        "metricType": "AverageValue",
        "metadata": {
            "url": starting_url,
            "format": "json",
            "valueLocation": names.STARTING_FIELD,
            "targetValue": number(HTTP_RATE_TARGET),
            "activationTargetValue": "0",
        },
    }


def build_scaled_object(
    plan: ModelPlan, *, scaler_address: str, prometheus_address: str, starting_url: str = ""
) -> Any:
    """KEDA's ScaledObject on the SpyreModel's ``/scale``: 0 <-> 1 on requests, 1..N on load.

    ``scaler_address``: the add-on's external scaler (``<service>.<namespace>:<grpc port>``);
    ``prometheus_address``: the Prometheus that scrapes the engine pods (``http://host:port``);
    ``starting_url``: the operator's answer whether the model is starting (empty: none, and a
    wake-up must finish within the rate window plus ``idleSeconds``).
    KEDA owns the HPA it creates (``keda-hpa-<name>``); the operator's own HPA must not exist
    for this model (KEDA's webhook refuses a target another HPA manages).
    """
    auto = _auto(plan)
    s2z = scale_to_zero_settings(auto)
    name = names.server_name(plan.name)
    return ScaledObject(
        apiVersion=f"{KEDA_GROUP}/{KEDA_VERSION}",
        kind=SCALED_OBJECT_KIND,
        metadata=_meta(plan, name),
        spec={
            "scaleTargetRef": {"apiVersion": API_VERSION, "kind": KIND, "name": plan.name},
            "minReplicaCount": 0,
            "maxReplicaCount": auto.max_replicas,
            # Seconds after the last active trigger before 1 -> 0 (N -> 0 directly).
            "cooldownPeriod": s2z.idle_seconds,
            # ... and after the ScaledObject's creation while no trigger was ever active
            # (KEDA's default 0 takes a new model to zero before anyone could call it).
            "initialCooldownPeriod": s2z.idle_seconds,
            "advanced": {
                "horizontalPodAutoscalerConfig": {"behavior": hpa_behavior(auto).to_dict()}
            },
            "triggers": [
                {
                    "type": EXTERNAL_PUSH,
                    "name": "http-requests",
                    "metadata": {"scalerAddress": scaler_address, "httpScaledObject": name},
                },
                *([starting_trigger(starting_url)] if starting_url else []),
                *(prometheus_triggers(plan, prometheus_address) if prometheus_address else []),
            ],
        },
    )
