"""Cards through DRA (spec.accelerator.deviceClassName): which ResourceClaimTemplates the
model keeps, which it deletes, and the devices its serving pods hold (pure, no I/O)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..desired.devices import build_cards_template, device_class
from ..desired.plan import ModelPlan
from ..desired.pod import compiles_on_cards, serves_on_cards
from . import conditions as C
from .observed import Observed

#: status.devices lists at most this many (pod, device) pairs.
MAX_STATUS_DEVICES = 16


@dataclass
class DevicesOutcome:
    """The model's templates to apply and delete, and status.devices."""

    #: ResourceClaimTemplates (generic resources: desired/devices.py)
    apply: list[Any] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)
    status: list[dict[str, str]] = field(default_factory=list)


def claims_cards(plan: ModelPlan) -> bool:
    """Some pod of the model claims cards through DRA (its servers, or its compile onCards)."""
    return device_class(plan.spec) is not None and (
        serves_on_cards(plan.spec) or compiles_on_cards(plan.spec)
    )


def decide_devices(
    plan: ModelPlan, serving_plan: ModelPlan | None, obs: Observed
) -> DevicesOutcome:
    """A template for the spec (its Job onCards and its next pods) and one for the spec the
    Deployment serves now, if another; a template of the model's that neither needs and no pod
    of the model was made from is deleted (a template's spec is immutable: a change of class
    or card count is a new template, and the serving pods keep the claims of the old one)."""
    out = DevicesOutcome()
    for p in (plan, serving_plan):
        if p is not None and claims_cards(p):
            t = build_cards_template(p)
            if all(t.metadata.name != o.metadata.name for o in out.apply):
                out.apply.append(t)
    wanted = {t.metadata.name for t in out.apply}
    in_use = {n for pod in [*obs.server_pods, *obs.job_pods] for n in pod.get("claimTemplates", [])}
    out.delete = sorted(n for n in obs.cards_templates if n not in wanted and n not in in_use)
    out.status = devices_status(obs.server_pods)
    return out


def devices_status(pods: list[dict[str, Any]]) -> list[dict[str, str]]:
    """status.devices: the devices allocated to the serving pods' claims, by pod name."""
    out = [
        {"pod": str(p["name"]), **d}
        for p in sorted(pods, key=lambda p: str(p.get("name")))
        for d in p.get("devices") or []
    ]
    return out[:MAX_STATUS_DEVICES]


def device_class_problem(plan: ModelPlan, obs: Observed) -> str | None:
    """Why no pod of the model can get cards: its DeviceClass does not exist (None: it does,
    or that is not known, or the model claims no cards)."""
    cls = device_class(plan.spec)
    if cls is None or obs.device_class_found is not False or not claims_cards(plan):
        return None
    where = (
        "the operator's default, chart defaults.deviceClassName"
        if "accelerator.deviceClassName" in plan.from_defaults
        else "spec.accelerator.deviceClassName"
    )
    return (
        f"DeviceClass {cls} ({where}) does not exist: no pod can claim cards of it. IBM's "
        "Spyre Operator in DRA mode makes spyre-pf, spyre-standard-vf and spyre-privileged-vf"
    )


def unschedulable_reason(plan: ModelPlan, obs: Observed) -> str:
    """The reason of serving pods that wait for a node: DevicesUnavailable when their cards
    come through DRA and a pod's claim is not allocated (the scheduler's message says why),
    DeviceClassNotFound when its class does not exist, else InsufficientCapacity."""
    if device_class(plan.spec) is None or not serves_on_cards(plan.spec):
        return C.INSUFFICIENT_CAPACITY
    if device_class_problem(plan, obs):
        return C.DEVICE_CLASS_NOT_FOUND
    stuck = [p for p in obs.server_pods if p.get("unschedulable")]
    if any(not p.get("devices") for p in stuck):
        return C.DEVICES_UNAVAILABLE
    return C.INSUFFICIENT_CAPACITY
