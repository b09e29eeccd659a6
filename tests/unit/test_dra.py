"""Spyre cards through Dynamic Resource Allocation: spec.accelerator.deviceClassName (and the
site's default) instead of the device plugin's extended resource."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from pydantic import ValidationError
from spyre_operator.api.v1alpha1 import SpyreModelSpec
from spyre_operator.crd import build_crd
from spyre_operator.desired.plan import plan_model
from spyre_operator.desired.site import SiteDefaults

from .samples import GENERATE, SITE

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
