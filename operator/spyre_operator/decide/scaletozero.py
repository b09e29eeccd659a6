"""The scale-to-zero decision: what a ``minReplicas: 0`` model needs from KEDA and its HTTP
add-on, and its Autoscaling condition (:func:`decide_scale_to_zero`; pure, no I/O)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lightkube.resources.core_v1 import Service
from lightkube.resources.discovery_v1 import EndpointSlice

from ..desired import names
from ..desired.autoscaling import targets
from ..desired.plan import ModelPlan
from ..desired.scaletozero import (
    HTTPScaledObject,
    ScaledObject,
    build_coldstart_service,
    build_engine_service,
    build_http_scaled_object,
    build_mirror_slice,
    build_scaled_object,
    interceptor_endpoints,
    wants_scale_to_zero,
)
from . import conditions as C
from .observed import API_FORBIDDEN, API_NOT_SERVED, API_UNKNOWN, Observed
from .serving import unschedulable_of


@dataclass
class ScaleToZeroOutcome:
    """What a model with (or without) ``minReplicas: 0`` needs from KEDA and its add-on."""

    apply: list[Any] = field(default_factory=list)
    delete: list[tuple[type, str]] = field(default_factory=list)
    #: The Autoscaling condition of a scale-to-zero model (None: not one).
    cond: C.Cond | None = None
    #: The model's Service points at the interceptor (selector-less + mirrored EndpointSlice).
    via_interceptor: bool = False
    #: The ScaledObject's status.lastActiveTime.
    last_active: str | None = None


def _scale_to_zero_objects(plan: ModelPlan, obs: Observed) -> list[tuple[type, str]]:
    """The scale-to-zero children that exist (to delete when zero is switched off)."""
    name = plan.name
    return [
        (resource, obj_name)
        for resource, obj_name, live in (
            (HTTPScaledObject, names.server_name(name), obs.http_scaled_object),
            (ScaledObject, names.server_name(name), obs.scaled_object),
            (EndpointSlice, names.mirror_slice_name(name), obs.mirror_slice),
            (Service, names.engine_service_name(name), obs.engine_service),
            (Service, names.coldstart_service_name(name), obs.coldstart_service),
        )
        if live is not None
    ]


def _scale_to_zero_problems(plan: ModelPlan, obs: Observed) -> list[str] | None:
    """Why the model cannot scale to zero now ([]: it can; None: not known yet)."""
    if not obs.keda.enabled:
        return [
            "scale to zero is off in this operator (--no-scale-to-zero; the chart's "
            "scaleToZero.enabled=false): install KEDA and its HTTP add-on, then turn it on"
        ]
    problems, unknown = [], False
    for api, crd, state, message in (
        ("ScaledObjects", "scaledobjects.keda.sh", obs.scaled_object_api,
         obs.scaled_object_api_message),
        ("HTTPScaledObjects", "httpscaledobjects.http.keda.sh", obs.http_scaled_object_api,
         obs.http_scaled_object_api_message),
    ):  # fmt: skip
        if state == API_NOT_SERVED:
            problems.append(
                f"the cluster does not serve {api} ({crd}/v1alpha1): install KEDA and its HTTP "
                f"add-on; the operator creates them once they exist ({message or 'not found'})"
            )
        elif state == API_FORBIDDEN:
            problems.append(
                f"the operator may not watch or write {api} (grant list, watch, create, patch, "
                f"delete on {crd}): {message}"
            )
        elif state == API_UNKNOWN:
            unknown = True
    auto = plan.spec.autoscaling
    if auto is not None and targets(auto) and not obs.keda.prometheus_address:
        problems.append(
            "autoscaling targets need the operator's --prometheus-address (the ScaledObject's "
            "prometheus triggers); without targets the model scales 0 <-> 1 on requests alone"
        )
    if obs.foreign_scale_to_zero:
        problems.append(obs.foreign_scale_to_zero)
    if problems:
        return problems
    if unknown:
        return None
    endpoints, port, _ = interceptor_endpoints(
        obs.interceptor_slices, obs.keda.interceptor_port_name
    )
    if obs.mirror_slice is None and (not endpoints or port is None):
        problems.append(
            f"the interceptor Service {obs.keda.interceptor_namespace}/"
            f"{obs.keda.interceptor_service} has no endpoints: the model's Service keeps "
            "selecting its pods until it has"
        )
    return problems


def _scaled_object_condition(name: str, so: dict[str, Any] | None) -> C.Cond:
    """Autoscaling from KEDA's ScaledObject (its Ready condition)."""
    t = C.AUTOSCALING
    if so is None:
        return C.Cond(t, C.UNKNOWN, C.AUTOSCALER_PENDING, f"creating ScaledObject {name}")
    st = so.get("status") or {}
    ready = next((c for c in st.get("conditions") or [] if c.get("type") == "Ready"), None)
    if ready is None or ready.get("status") == C.UNKNOWN:
        return C.Cond(t, C.UNKNOWN, C.AUTOSCALER_PENDING, f"KEDA has not taken up {name} yet")
    if ready.get("status") != C.TRUE:
        return C.Cond(
            t,
            C.FALSE,
            C.SCALED_OBJECT_NOT_READY,
            f"ScaledObject {name}: {ready.get('reason') or ''}: {ready.get('message') or ''}"[
                :1024
            ],
        )
    spec = so.get("spec") or {}
    msg = f"KEDA scales between 0 and {spec.get('maxReplicaCount')} replicas"
    if st.get("lastActiveTime"):
        msg += f"; last active {st['lastActiveTime']}"
    return C.Cond(t, C.TRUE, C.SCALE_TO_ZERO_ACTIVE, msg)


def decide_scale_to_zero(plan: ModelPlan, obs: Observed, old_conditions: Any) -> ScaleToZeroOutcome:
    """The objects of a ``minReplicas: 0`` model, written only when KEDA serves both APIs.

    As with InferencePools: an API that is not served (or forbidden) is a condition, nothing
    is written or retried, and the optional-API watches reconcile the model when it appears.
    Meanwhile the model's Service keeps selecting its pods (it serves while replicas > 0).
    """
    out = ScaleToZeroOutcome()
    if not wants_scale_to_zero(plan):
        out.delete = _scale_to_zero_objects(plan, obs)
        return out
    so = obs.scaled_object
    out.last_active = ((so or {}).get("status") or {}).get("lastActiveTime")
    problems = _scale_to_zero_problems(plan, obs)
    if problems is None:  # the watches have not listed yet: keep what was there
        old = C.find(old_conditions, C.AUTOSCALING)
        out.cond = (
            C.Cond(C.AUTOSCALING, old["status"], old["reason"], old.get("message", ""))
            if old is not None
            else C.Cond(
                C.AUTOSCALING, C.UNKNOWN, C.AUTOSCALER_PENDING,
                "checking whether KEDA's APIs are served",
            )
        )  # fmt: skip
        out.via_interceptor = obs.mirror_slice is not None
        return out
    if problems:
        out.cond = C.Cond(
            C.AUTOSCALING, C.FALSE, C.SCALE_TO_ZERO_UNAVAILABLE, "; ".join(problems)[:1024]
        )
        out.delete = _scale_to_zero_objects(plan, obs)
        return out
    cfg = obs.keda
    endpoints, port, address_type = interceptor_endpoints(
        obs.interceptor_slices, cfg.interceptor_port_name
    )
    if port is None:  # the mirror exists and the interceptor has gone: keep its port
        port = int(((obs.mirror_slice or {}).get("ports") or [{}])[0].get("port") or 0)
    failover_service, failover_port, starting_url = None, None, ""
    if cfg.coldstart_service and cfg.coldstart_port:
        failover_service = names.coldstart_service_name(plan.name)
        failover_port = cfg.coldstart_port
        target = f"{cfg.coldstart_service}.{cfg.coldstart_namespace}.svc.cluster.local"
        starting_url = (
            f"http://{target}:{cfg.coldstart_port}"
            f"{names.starting_path(plan.namespace, plan.name)}"
        )
        out.apply.append(build_coldstart_service(plan, target, cfg.coldstart_port))
    elif obs.coldstart_service is not None:
        out.delete.append((Service, names.coldstart_service_name(plan.name)))
    out.apply += [
        build_engine_service(plan),
        build_http_scaled_object(
            plan,
            failover_service=failover_service,
            failover_port=failover_port,
            no_capacity=unschedulable_of(obs.server_pods) is not None,
        ),
        build_scaled_object(
            plan,
            scaler_address=cfg.scaler_address,
            prometheus_address=cfg.prometheus_address,
            starting_url=starting_url,
        ),
        build_mirror_slice(plan, endpoints, port, address_type),
    ]
    out.via_interceptor = True
    out.cond = _scaled_object_condition(names.server_name(plan.name), so)
    return out
