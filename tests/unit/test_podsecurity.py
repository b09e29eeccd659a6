"""--pod-user: who picks the uid of the pods the operator creates (issue 28)."""

from __future__ import annotations

import pytest
from spyre_operator.api import SpyreModelSpec
from spyre_operator.cli import build_parser, site_defaults
from spyre_operator.desired.deployment import build_deployment
from spyre_operator.desired.gcjob import build_gc_job
from spyre_operator.desired.job import build_precompile_job
from spyre_operator.desired.plan import plan_model
from spyre_operator.desired.pod import ENGINE_UID, pod_security_context
from spyre_operator.desired.site import SiteDefaults
from spyre_operator.kube.podsecurity import platform_assigns_user

from .samples import GENERATE


def _refuse() -> bool:
    raise AssertionError("probed the API server for an explicit mode")


@pytest.mark.parametrize(("mode", "served", "expected"), [
    ("assigned", None, True),
    ("fixed", None, False),
    ("auto", True, True),
    ("auto", False, False),
])
def test_pod_user_modes(mode: str, served: bool | None, expected: bool) -> None:
    probe = _refuse if served is None else (lambda: served)
    assert platform_assigns_user(mode, probe) is expected


def test_auto_says_what_failed_when_the_api_server_cannot_be_asked() -> None:
    def probe() -> bool:
        raise PermissionError("apiservices is forbidden")

    with pytest.raises(ValueError, match="apiservices is forbidden.*--pod-user assigned"):
        platform_assigns_user("auto", probe)


def test_the_flag_reaches_the_site_defaults() -> None:
    def parse(*args: str) -> SiteDefaults:
        return site_defaults(build_parser().parse_args(["run", "-A", *args]), lambda: True)  # type: ignore[no-any-return]

    assert parse("--pod-user", "assigned").platform_assigns_user
    assert not parse("--pod-user", "fixed").platform_assigns_user
    assert parse().platform_assigns_user  # auto, and the probe says OpenShift


def test_pod_security_context_pins_only_when_fixed() -> None:
    fixed = pod_security_context(False).to_dict()
    assert (fixed["runAsUser"], fixed["runAsGroup"], fixed["fsGroup"]) == (ENGINE_UID,) * 3
    assigned = pod_security_context(True).to_dict()
    assert not {"runAsUser", "runAsGroup", "fsGroup"} & set(assigned)
    for sc in (fixed, assigned):
        assert sc["runAsNonRoot"] is True and sc["seccompProfile"] == {"type": "RuntimeDefault"}


@pytest.mark.parametrize("assigned", [True, False])
def test_every_pod_builder_follows_the_site(assigned: bool) -> None:
    plan = plan_model("m", "ns", "uid", SpyreModelSpec.model_validate(GENERATE),
                      SiteDefaults(platform_assigns_user=assigned))
    templates = [build_precompile_job(plan, [plan.owner]).spec.template,
                 build_deployment(plan, plan.key).spec.template,
                 build_gc_job(plan, [plan.key], [plan.owner]).spec.template]
    for t in templates:
        sc = t.spec.securityContext.to_dict()
        assert ("runAsUser" in sc) is not assigned, sc
    # A served spec re-planned keeps the mode: the previous artifact's pods are admitted too.
    assert plan.site.for_served_spec().platform_assigns_user is assigned


def test_every_pod_the_operator_makes_pins_the_site_scc() -> None:
    """Issue 46, 2: the precompile, serving, canary and GC pods carry
    openshift.io/required-scc (over a model's own podAnnotations); none without a site SCC."""
    from spyre_operator.desired.deployment import build_canary_deployment
    from spyre_operator.desired.pod import REQUIRED_SCC_ANNOTATION

    spec = SpyreModelSpec.model_validate({
        **GENERATE,
        "precompile": {"podAnnotations": {REQUIRED_SCC_ANNOTATION: "anyuid", "team": "ml"}},
        "serving": {"podAnnotations": {REQUIRED_SCC_ANNOTATION: "anyuid"},
                    "canary": {"replicas": 1}},
    })  # fmt: skip

    def templates(site: SiteDefaults) -> list[dict[str, str]]:
        plan = plan_model("m", "ns", "uid", spec, site)
        return [t.metadata.annotations or {} for t in (
            build_precompile_job(plan, [plan.owner]).spec.template,
            build_deployment(plan, plan.key).spec.template,
            build_canary_deployment(plan, plan.key).spec.template,
            build_gc_job(plan, [plan.key], [plan.owner]).spec.template)]

    pinned = templates(SiteDefaults(platform_assigns_user=True, required_scc="restricted-v2"))
    assert [a[REQUIRED_SCC_ANNOTATION] for a in pinned] == ["restricted-v2"] * 4
    assert pinned[0]["team"] == "ml"
    # none pinned by the site: a model's own stays (OpenShift checks its ServiceAccount may)
    assert [a.get(REQUIRED_SCC_ANNOTATION) for a in templates(SiteDefaults())] == ["anyuid"] * 4
    # and the pin survives a re-plan of a served spec
    assert SiteDefaults(required_scc="x").for_served_spec().required_scc == "x"


def test_the_required_scc_flag_follows_the_pod_user() -> None:
    def parse(*args: str) -> SiteDefaults:
        return site_defaults(build_parser().parse_args(["run", "-A", *args]), lambda: True)  # type: ignore[no-any-return]

    assert parse().required_scc == "restricted-v2"  # auto on OpenShift
    assert parse("--pod-user", "fixed").required_scc == ""
    assert parse("--required-scc", "site-restricted").required_scc == "site-restricted"
    assert parse("--required-scc=").required_scc == ""


def test_every_pod_the_operator_makes_has_the_site_selinux_change_policy() -> None:
    """Issue 46, 3: one seLinuxChangePolicy for the precompile, serving, canary and GC pods
    (they share the cache claim: pods that disagree on a volume stay in ContainerCreating);
    none set unless the site sets one; kept on a re-plan of a served spec; the flag refuses
    what Kubernetes would."""
    from spyre_operator.desired.deployment import build_canary_deployment

    spec = SpyreModelSpec.model_validate({**GENERATE, "serving": {"canary": {"replicas": 1}}})

    def policies(site: SiteDefaults) -> list[str | None]:
        plan = plan_model("m", "ns", "uid", spec, site)
        return [t.spec.securityContext.seLinuxChangePolicy for t in (
            build_precompile_job(plan, [plan.owner]).spec.template,
            build_deployment(plan, plan.key).spec.template,
            build_canary_deployment(plan, plan.key).spec.template,
            build_gc_job(plan, [plan.key], [plan.owner]).spec.template)]  # fmt: skip

    assert policies(SiteDefaults()) == [None] * 4
    assert policies(SiteDefaults(selinux_change_policy="MountOption")) == ["MountOption"] * 4
    assert SiteDefaults(selinux_change_policy="Recursive").for_served_spec(
    ).selinux_change_policy == "Recursive"

    def parse(*args: str) -> SiteDefaults:
        return site_defaults(build_parser().parse_args(["run", "-A", *args]), lambda: True)  # type: ignore[no-any-return]

    assert parse().selinux_change_policy == ""
    assert parse("--selinux-change-policy", "Recursive").selinux_change_policy == "Recursive"
    with pytest.raises(SystemExit):
        parse("--selinux-change-policy", "recursive")
