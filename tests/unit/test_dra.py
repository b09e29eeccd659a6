"""Spyre cards through Dynamic Resource Allocation: spec.accelerator.deviceClassName (and the
site's default) instead of the device plugin's extended resource."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from pydantic import ValidationError
from spyre_operator.api.v1alpha1 import SpyreModelSpec
from spyre_operator.control.controller import compact_pod
from spyre_operator.decide import Observed, decide
from spyre_operator.decide import conditions as C
from spyre_operator.desired import names
from spyre_operator.desired.deployment import build_deployment
from spyre_operator.desired.devices import build_cards_template
from spyre_operator.desired.job import build_precompile_job
from spyre_operator.desired.plan import plan_model
from spyre_operator.desired.site import SiteDefaults
from spyre_operator.gen.crd import build_crd

from .samples import GENERATE, SITE, model
from .test_reconcile import BOUND, NOW, cond, deployment_obj, job_obj

CLASS = "spyre-standard-vf"
SENDNN = {**GENERATE, "compile": {"backend": "sendnn", "tensorParallelSize": 2}}


def spec_with(accelerator: dict[str, Any], base: dict[str, Any] = SENDNN) -> dict[str, Any]:
    return {**base, "accelerator": accelerator}


def plan(spec: dict[str, Any], site: SiteDefaults = SITE) -> Any:
    return plan_model("m", "ns", "uid-m", SpyreModelSpec.model_validate(spec), site)


# ------------------------------------------------------------------------------ resolution


def test_a_model_naming_a_class_gets_no_resource_and_the_default_scheduler() -> None:
    acc = plan(spec_with({"deviceClassName": CLASS})).spec.accelerator
    assert acc.device_class_name == CLASS
    assert acc.resource_name is None, "cards come one way"
    assert acc.scheduler_name == "", "DRA pods go to kube-scheduler, not the site's scheduler"


def test_an_explicit_scheduler_still_wins_with_a_class() -> None:
    acc = plan(spec_with({"deviceClassName": CLASS, "schedulerName": "mine"})).spec.accelerator
    assert acc.scheduler_name == "mine"


def test_the_site_class_applies_to_models_that_name_neither() -> None:
    p = plan(SENDNN, replace(SITE, device_class_name="spyre-pf"))
    assert p.spec.accelerator.device_class_name == "spyre-pf"
    assert p.spec.accelerator.resource_name is None
    assert p.spec.accelerator.scheduler_name == ""
    assert "accelerator.deviceClassName" in p.from_defaults
    assert "accelerator.resourceName" not in p.from_defaults


def test_a_model_naming_a_resource_keeps_it_under_a_site_class() -> None:
    p = plan(spec_with({"resourceName": "ibm.com/spyre_vf"}),
             replace(SITE, device_class_name="spyre-pf"))
    acc = p.spec.accelerator
    assert (acc.resource_name, acc.device_class_name) == ("ibm.com/spyre_vf", None)
    assert acc.scheduler_name == SITE.scheduler_name


def test_without_a_site_class_nothing_changes() -> None:
    acc = plan(SENDNN).spec.accelerator
    assert (acc.resource_name, acc.device_class_name) == (SITE.resource_name, None)
    assert acc.scheduler_name == SITE.scheduler_name


def test_status_effective_names_the_class() -> None:
    from spyre_operator.desired.site import effective_status

    p = plan(spec_with({"deviceClassName": CLASS}))
    eff = effective_status(p.spec, p.from_defaults, None)
    assert eff["deviceClassName"] == CLASS and "resourceName" not in eff


def _accelerator_schema() -> dict[str, Any]:
    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema["properties"]["spec"]["properties"]["accelerator"]


def test_the_crd_refuses_a_resource_and_a_class_together() -> None:
    acc = _accelerator_schema()
    rules = [v["rule"] for v in acc.get("x-kubernetes-validations", [])]
    assert "!(has(self.resourceName) && has(self.deviceClassName))" in rules
    field = acc["properties"]["deviceClassName"]
    assert field["maxLength"] == 253 and field["pattern"].startswith("^[a-z0-9]")


@pytest.mark.parametrize("bad", ["Spyre_VF", "-x", "a" * 254])
def test_the_class_name_is_a_dns_subdomain(bad: str) -> None:
    with pytest.raises(ValidationError):
        SpyreModelSpec.model_validate(spec_with({"deviceClassName": bad}))


# ------------------------------------------------------------------------------ builders


def _pod(obj: Any) -> Any:
    return obj.spec.template.spec


def test_a_server_on_a_class_claims_its_cards_and_requests_no_extended_resource() -> None:
    p = plan(spec_with({"deviceClassName": CLASS}))
    pod = _pod(build_deployment(p, p.key))
    (engine,) = pod.containers
    assert not engine.resources.limits and not engine.resources.requests
    assert [c.name for c in engine.resources.claims] == ["spyre"]
    (claim,) = pod.resourceClaims
    assert (claim.name, claim.resourceClaimTemplateName) == ("spyre", names.cards_template_name(
        "m", CLASS, 2))
    assert pod.schedulerName is None, "kube-scheduler allocates the claim"
    env = {e.name: e.value for e in engine.env}
    assert env["FLEX_DEVICE"] == "VF"


@pytest.mark.parametrize("cls,flex", [("spyre-standard-vf", "VF"), ("spyre-privileged-vf", "VF"),
                                      ("spyre-pf", "PF"), ("spyre.ibm.com", "PF")])
def test_flex_device_follows_the_class(cls: str, flex: str) -> None:
    p = plan(spec_with({"deviceClassName": cls}))
    env = {e.name: e.value for e in _pod(build_deployment(p, p.key)).containers[0].env}
    assert env["FLEX_DEVICE"] == flex


def test_the_template_asks_for_the_models_cards_of_its_class() -> None:
    p = plan(spec_with({"deviceClassName": CLASS}))
    t = build_cards_template(p).to_dict()
    assert t["apiVersion"] == "resource.k8s.io/v1" and t["kind"] == "ResourceClaimTemplate"
    (req,) = t["spec"]["spec"]["devices"]["requests"]
    assert req == {"name": "cards", "exactly": {"deviceClassName": CLASS,
                                                 "allocationMode": "ExactCount", "count": 2}}
    assert t["metadata"]["ownerReferences"][0]["uid"] == "uid-m"
    assert t["metadata"]["labels"][names.MODEL_LABEL] == "m"


def test_the_template_name_changes_with_its_request_only() -> None:
    a = names.cards_template_name("m", CLASS, 1)
    assert a == names.cards_template_name("m", CLASS, 1)
    assert a != names.cards_template_name("m", CLASS, 2)
    assert a != names.cards_template_name("m", "spyre-pf", 1)
    long = names.cards_template_name("x" * 200 + ".y", CLASS, 4)
    assert len(long) <= names.MAX_NAME and names.CARDS_INFIX in long


def test_the_compile_off_the_cards_claims_nothing_and_on_the_cards_claims_the_template() -> None:
    off = plan(spec_with({"deviceClassName": CLASS}))
    pod = _pod(build_precompile_job(off, [off.owner]))
    assert pod.resourceClaims is None and pod.containers[0].resources.claims is None
    on = plan({**spec_with({"deviceClassName": CLASS}), "precompile": {"onCards": True}})
    pod = _pod(build_precompile_job(on, [on.owner]))
    assert [c.resourceClaimTemplateName for c in pod.resourceClaims] == [
        names.cards_template_name("m", CLASS, 2)]
    assert not pod.containers[0].resources.limits


def test_a_cpu_backend_claims_nothing() -> None:
    p = plan({**spec_with({"deviceClassName": CLASS}, GENERATE), "compile": {"backend": "eager"}})
    pod = _pod(build_deployment(p, p.key))
    assert pod.resourceClaims is None
    d = decide(model("m", p.spec.model_dump(by_alias=True, exclude_none=True)), Observed(), NOW)
    assert "ResourceClaimTemplate" not in [o.kind for o in d.apply]


# ------------------------------------------------------------------------------ decisions

DRA_SPEC = spec_with({"deviceClassName": CLASS})


def _serving(m: dict[str, Any], ready: int = 1, replicas: int = 1) -> Observed:
    obs = Observed(cache_pvc=BOUND, job=job_obj(m, "Complete"))
    obs.deployment = deployment_obj(decide(m, obs, NOW), ready=ready, replicas=replicas)
    return obs


def _templates(d: Any) -> list[str]:
    return [o.metadata.name for o in d.apply if o.kind == "ResourceClaimTemplate"]


def test_the_model_applies_its_template_with_the_pods_that_claim_from_it() -> None:
    m = model("m", DRA_SPEC)
    d = decide(m, Observed(cache_pvc=BOUND), NOW)
    assert _templates(d) == [names.cards_template_name("m", CLASS, 2)], "before any pod"
    d = decide(m, _serving(m), NOW)
    dep = next(o for o in d.apply if o.kind == "Deployment")
    assert _templates(d) == [dep.spec.template.spec.resourceClaims[0].resourceClaimTemplateName]


def test_a_device_plugin_model_has_no_template() -> None:
    m = model("m", SENDNN)
    assert _templates(decide(m, _serving(m), NOW)) == []


def _pod_record(name: str, template: str, **extra: Any) -> dict[str, Any]:
    rec = compact_pod({"metadata": {"name": name},
                       "spec": {"resourceClaims": [{"name": "spyre",
                                                    "resourceClaimTemplateName": template}]},
                       "status": {"phase": "Running"}})
    return {**rec, **extra}


def test_an_unused_template_is_deleted_and_one_a_pod_was_made_from_is_kept() -> None:
    m = model("m", DRA_SPEC)
    obs = _serving(m)
    old, older = names.cards_template_name("m", CLASS, 8), names.cards_template_name("m", CLASS, 9)
    current = names.cards_template_name("m", CLASS, 2)
    obs.cards_templates = {n: {} for n in (old, older, current)}
    obs.server_pods = [_pod_record("m-1", old)]
    d = decide(m, obs, NOW)
    deleted = [n for r, n in d.delete if r.__name__ == "ResourceClaimTemplate"]
    assert deleted == [older], "in use by a serving pod: kept; wanted: kept"


def test_a_new_card_count_keeps_the_template_of_the_spec_that_serves() -> None:
    """Another tensorParallelSize is another artifact: while it compiles, the Deployment is
    built from the served spec, so that spec's template stays applied beside the new one."""
    m = model("m", DRA_SPEC)
    obs = _serving(m)
    obs.job = None  # the new artifact's Job is not there yet
    m4 = model("m", {**DRA_SPEC, "compile": {"backend": "sendnn", "tensorParallelSize": 4}})
    d = decide(m4, obs, NOW)
    assert d.job is not None, "the new artifact compiles"
    assert sorted(_templates(d)) == sorted([names.cards_template_name("m", CLASS, 4),
                                            names.cards_template_name("m", CLASS, 2)])
    dep = next(o for o in d.apply if o.kind == "Deployment")
    assert dep.spec.template.spec.resourceClaims[0].resourceClaimTemplateName == (
        names.cards_template_name("m", CLASS, 2))


def test_compact_pod_reads_the_claims_and_their_templates() -> None:
    rec = compact_pod({"metadata": {"name": "p"},
                       "spec": {"resourceClaims": [{"name": "spyre",
                                                    "resourceClaimTemplateName": "t"}]},
                       "status": {"resourceClaimStatuses": [{"name": "spyre",
                                                             "resourceClaimName": "p-spyre-x"}]}})
    assert rec["claimTemplates"] == ["t"] and rec["claims"] == ["p-spyre-x"]
    assert "claims" not in compact_pod({"metadata": {"name": "q"}})


UNSCHEDULABLE = ("0/1 nodes are available: 1 cannot allocate all claims. preemption: 0/1 nodes "
                 "are available: 1 Preemption is not helpful for scheduling.")


def _unschedulable(name: str, **extra: Any) -> dict[str, Any]:
    rec = compact_pod({"metadata": {"name": name}, "status": {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
         "message": UNSCHEDULABLE}]}})
    return {**rec, **extra}


def test_a_claim_that_cannot_be_allocated_is_devices_unavailable_with_the_schedulers_message(
) -> None:
    m = model("m", {**DRA_SPEC, "replicas": 2})
    obs = _serving(m, ready=1, replicas=2)
    obs.device_class_found = True
    obs.server_pods = [_unschedulable("m-2")]
    p = cond(decide(m, obs, NOW), C.PROGRESSING)
    assert (p["status"], p["reason"]) == ("True", C.DEVICES_UNAVAILABLE)
    assert UNSCHEDULABLE in p["message"]


def test_without_dra_an_unschedulable_pod_is_still_insufficient_capacity() -> None:
    m = model("m", {**SENDNN, "replicas": 2})
    obs = _serving(m, ready=1, replicas=2)
    obs.server_pods = [_unschedulable("m-2")]
    assert cond(decide(m, obs, NOW), C.PROGRESSING)["reason"] == C.INSUFFICIENT_CAPACITY


def test_a_missing_device_class_is_named_and_warned_about() -> None:
    m = model("m", DRA_SPEC)
    obs = Observed(cache_pvc=BOUND, device_class_found=False)
    d = decide(m, obs, NOW)
    deg = cond(d, C.DEGRADED)
    assert (deg["status"], deg["reason"]) == ("True", C.DEVICE_CLASS_NOT_FOUND)
    assert f"DeviceClass {CLASS} (spec.accelerator.deviceClassName) does not exist" in (
        deg["message"])
    assert [(t, r) for t, r, _ in d.events] == [("Warning", C.DEVICE_CLASS_NOT_FOUND)]
    obs.device_class_found = None  # not readable (a namespaced install): nothing claimed
    assert cond(decide(m, obs, NOW), C.DEGRADED)["reason"] != C.DEVICE_CLASS_NOT_FOUND


def test_the_site_class_is_named_as_the_operators_default_when_missing() -> None:
    from spyre_operator.decide import Policy

    m = model("m", SENDNN)
    site = replace(SiteDefaults(), device_class_name="spyre-nope")
    d = decide(m, Observed(cache_pvc=BOUND, device_class_found=False), NOW, Policy(site=site))
    assert "DeviceClass spyre-nope (the operator's default" in cond(d, C.DEGRADED)["message"]


def test_status_lists_the_devices_of_the_serving_pods() -> None:
    m = model("m", DRA_SPEC)
    obs = _serving(m)
    dev = {"driver": "spyre.ibm.com", "pool": "node-a", "device": "0000-1a-00-1"}
    obs.server_pods = [_pod_record("m-b", "t", devices=[dev]), _pod_record("m-a", "t")]
    d = decide(m, obs, NOW)
    assert d.status["devices"] == [{"pod": "m-b", **dev}]
    from spyre_operator.api.v1alpha1 import SpyreModelStatus

    SpyreModelStatus.model_validate(d.status)  # the CRD's schema has the field
