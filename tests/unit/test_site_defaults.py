"""Cluster-wide defaults of per-site fields, followed at reconcile time, and the engine-image
allow-list (pure plan_model / decide() cases)."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import pytest
from spyre_operator.api.v1alpha1 import SpyreModelSpec
from spyre_operator.decide import Observed, Policy, decide
from spyre_operator.decide import conditions as C
from spyre_operator.desired.deployment import build_deployment
from spyre_operator.desired.job import build_precompile_job
from spyre_operator.desired.plan import plan_model
from spyre_operator.desired.site import SiteDefaults
from spyre_operator.gen.crd import build_crd

from .samples import GENERATE, SITE, model
from .test_reconcile import NOW, cond
from .test_reconcile_correctness import bound


def plan(spec: dict[str, Any], site: SiteDefaults = SITE) -> Any:
    return plan_model("m", "ns", "uid-m", SpyreModelSpec.model_validate(spec), site)


def completed_job(m: dict[str, Any], site: SiteDefaults) -> dict[str, Any]:
    """The spec's precompile Job, finished (under ``site``'s key)."""
    p = plan(m["spec"], site)
    return {"metadata": {"name": p.job_name, "uid": "job-uid", "resourceVersion": "5",
                         "ownerReferences": [{"kind": "SpyreModel", "name": "m", "uid": "uid-m"}]},
            "status": {"startTime": NOW, "completionTime": NOW, "succeeded": 1,
                       "conditions": [{"type": "Complete", "status": "True"}]}}


def serving(m: dict[str, Any], site: SiteDefaults) -> Observed:
    """A model whose artifact under ``site`` is ready and whose Deployment serves it."""
    obs = Observed(cache_pvc=bound(), job=completed_job(m, site))
    d = decide(m, obs, NOW, Policy(site=site))
    dep = next(o for o in d.apply if o.kind == "Deployment").to_dict()
    dep["status"] = {"replicas": 1, "readyReplicas": 1, "availableReplicas": 1,
                     "updatedReplicas": 1}
    obs.deployment = dep
    return obs


# ------------------------------------------------------------------------------ resolution


def test_unset_fields_follow_the_defaults() -> None:
    p = plan(GENERATE)
    dep = build_deployment(p, p.key).spec.template.spec
    assert dep.containers[0].image == SITE.engine_image
    assert [s.name for s in dep.imagePullSecrets] == ["registry-pull"]
    assert dep.schedulerName == "site-scheduler"
    assert dep.nodeSelector == {"pool": "spyre"}
    assert [t.key for t in dep.tolerations] == ["spyre"]
    assert dep.containers[0].resources.limits["ibm.com/spyre_pf"] == "1"
    job = build_precompile_job(p, [p.owner]).spec.template.spec
    assert job.containers[0].image == SITE.engine_image
    assert job.nodeSelector == {"pool": "cpu"}, "compiling off the cards: the CPU pool"
    assert "engine.image" in p.from_defaults and "accelerator.schedulerName" in p.from_defaults


def test_the_models_own_values_win() -> None:
    spec = {**GENERATE,
            "engine": {"image": "registry.example.com/spyre/mine:2", "imagePullSecrets": []},
            "accelerator": {"resourceName": "ibm.com/spyre_vf", "schedulerName": "",
                            "nodeSelector": {}, "tolerations": []},
            "precompile": {"nodeSelector": {"pool": "big"}},
            "cache": {"volume": {"storageClassName": "local"}}}
    p = plan(spec)
    pod = build_deployment(p, p.key).spec.template.spec
    assert pod.containers[0].image == "registry.example.com/spyre/mine:2"
    assert not pod.imagePullSecrets and not pod.nodeSelector and not pod.tolerations
    assert pod.schedulerName is None, '"" is the cluster\'s default scheduler, not the site\'s'
    assert pod.containers[0].resources.limits == {"ibm.com/spyre_vf": "1"}
    job = build_precompile_job(p, [p.owner]).spec.template.spec
    assert job.nodeSelector == {"pool": "big"}
    assert p.from_defaults == ("engine.serviceAccountName", "precompile.tolerations")
    assert p.storage_class(None) == "local"


def test_without_defaults_the_builtin_values_are_the_old_crd_defaults() -> None:
    """An operator run without the chart's defaults builds what the CRD defaults built."""
    p = plan_model("m", "ns", "uid-m", SpyreModelSpec.model_validate(GENERATE))
    old = {**GENERATE, "engine": {"image": "ghcr.io/spyre-model-operator/spyre-engine:0.1.0"},
           "accelerator": {"resourceName": "ibm.com/spyre_vf",
                           "schedulerName": "spyre-scheduler"}}
    q = plan_model("m", "ns", "uid-m", SpyreModelSpec.model_validate(old))
    assert p.key == q.key
    assert build_deployment(p, p.key).to_dict() == build_deployment(q, q.key).to_dict()


def test_a_new_default_engine_image_is_a_new_key_and_a_new_default_elsewhere_is_not() -> None:
    base = plan(GENERATE)
    new_image = plan(GENERATE, replace(SITE, engine_image="r/e:2"))
    assert new_image.key != base.key
    placement = plan(GENERATE, replace(SITE, scheduler_name="other",
                                       serving_node_selector={"pool": "b"}))
    assert placement.key == base.key
    pinned = {**GENERATE, "engine": {"image": SITE.engine_image}}
    assert plan(pinned, replace(SITE, engine_image="r/e:2")).key == base.key


def test_a_default_engine_image_change_compiles_while_the_old_pods_serve() -> None:
    """Not frozen at admission: the next reconcile under the new default compiles the new key
    in the background, and the Deployment keeps the old image and key until it is ready."""
    m = model("m", GENERATE)
    obs = serving(m, SITE)
    old_key = plan(GENERATE).key
    upgraded = replace(SITE, engine_image="registry.example.com/spyre/e:2")
    obs.job = None
    d = decide(copy.deepcopy(m), obs, NOW, Policy(site=upgraded))
    assert d.job is not None
    assert d.job.spec.template.spec.containers[0].image == "registry.example.com/spyre/e:2"
    dep = next(o for o in d.apply if o.kind == "Deployment")
    assert dep.metadata.annotations["serving.spyre.dev/artifact-key"] == old_key
    assert dep.spec.template.spec.containers[0].image == SITE.engine_image
    assert cond(d, C.READY)["reason"] == C.SERVING_PREVIOUS_ARTIFACT
    assert d.status["effective"]["engineImage"] == "registry.example.com/spyre/e:2"


# ------------------------------------------------------------------------------ status


def test_status_shows_the_effective_values_and_which_follow_the_defaults() -> None:
    m = model("m", {**GENERATE, "accelerator": {"schedulerName": "mine"}})
    d = decide(m, Observed(), NOW, Policy(site=SITE))
    eff = d.status["effective"]
    assert eff["engineImage"] == SITE.engine_image
    assert eff["imagePullSecrets"] == ["registry-pull"]
    assert eff["resourceName"] == "ibm.com/spyre_pf"
    assert eff["schedulerName"] == "mine"
    assert eff["storageClassName"] == "nfs-rwx", "the class the PVC is created with"
    assert "accelerator.schedulerName" not in eff["fromDefaults"]
    assert {"engine.image", "cache.volume.storageClassName"} <= set(eff["fromDefaults"])
    from spyre_operator.api.v1alpha1 import SpyreModelStatus

    SpyreModelStatus.model_validate(d.status)  # the CRD's status schema has these fields


# ------------------------------------------------------------------------------ storage class


def test_the_default_storage_class_applies_when_the_pvc_is_created() -> None:
    d = decide(model("m", GENERATE), Observed(), NOW, Policy(site=SITE))
    pvc = next(o for o in d.apply if o.kind == "PersistentVolumeClaim")
    assert pvc.spec.storageClassName == "nfs-rwx"


def test_an_existing_pvc_keeps_its_class_when_the_default_changes() -> None:
    """Not a ClaimImmutable edit: the PVC was made under an earlier default."""
    d = decide(model("m", GENERATE), Observed(cache_pvc=bound(storage_class="old-rwx")), NOW,
               Policy(site=SITE))
    pvc = next(o for o in d.apply if o.kind == "PersistentVolumeClaim")
    assert pvc.spec.storageClassName == "old-rwx"
    assert cond(d, C.DEGRADED)["status"] == C.FALSE
    assert d.status["effective"]["storageClassName"] == "old-rwx"


# ------------------------------------------------------------------------------ allow-list


@pytest.mark.parametrize(
    "image,allowed",
    [
        ("registry.example.com/spyre/spyre-engine:1.0", True),
        ("registry.example.com/spyre/team/engine@sha256:abc", True),
        ("quay.io/ibm-aiu/engine:1", True),
        ("registry.example.com/other/engine:1", False),
        ("registry.example.com.evil.io/spyre/engine:1", False),
        ("docker.io/library/python:3", False),
    ],
)
def test_allow_list_patterns(image: str, allowed: bool) -> None:
    site = SiteDefaults(allowed_engine_images=("registry.example.com/spyre/*",
                                               "quay.io/ibm-aiu/engine:*"))
    assert site.allows(image) is allowed
    assert SiteDefaults().allows(image), "no allow-list: any image"


def test_an_image_outside_the_allow_list_is_refused_and_nothing_is_compiled() -> None:
    site = replace(SITE, allowed_engine_images=("registry.example.com/spyre/*",))
    m = model("m", {**GENERATE, "engine": {"image": "docker.io/evil/miner:1"}})
    d = decide(m, Observed(cache_pvc=bound()), NOW, Policy(site=site))
    assert d.job is None and not d.apply and not d.delete
    for type_ in (C.READY, C.ARTIFACT_READY):
        c = cond(d, type_)
        assert (c["status"], c["reason"]) == (C.FALSE, C.ENGINE_IMAGE_NOT_ALLOWED)
        assert "docker.io/evil/miner:1" in c["message"] and "allowedEngineImages" in c["message"]
    assert cond(d, C.DEGRADED)["status"] == C.TRUE
    assert d.events and d.events[0][:2] == ("Warning", C.ENGINE_IMAGE_NOT_ALLOWED)
    assert d.status["effective"]["engineImage"] == "docker.io/evil/miner:1"
    # the default image is allowed: leaving the field unset serves
    ok = decide(model("m", GENERATE), Observed(cache_pvc=bound()), NOW, Policy(site=site))
    assert ok.job is not None


def test_a_refused_image_leaves_the_serving_deployment_alone() -> None:
    """The allow-list tightened under a serving model: it keeps serving what it serves."""
    m = model("m", GENERATE)
    obs = serving(m, SITE)
    strict = replace(SITE, allowed_engine_images=("quay.io/x/*",))
    d = decide(m, obs, NOW, Policy(site=strict))
    assert not d.apply and not d.delete and d.job is None
    c = cond(d, C.READY)
    assert c["reason"] == C.ENGINE_IMAGE_NOT_ALLOWED
    assert "operator's default engine image" in c["message"]


# ------------------------------------------------------------------------------ CRD


@pytest.mark.parametrize(
    "path",
    [
        ("engine", "image"),
        ("engine", "imagePullSecrets"),
        ("accelerator", "resourceName"),
        ("accelerator", "schedulerName"),
        ("accelerator", "nodeSelector"),
        ("accelerator", "tolerations"),
        ("precompile", "nodeSelector"),
        ("precompile", "tolerations"),
        ("cache", "volume", "storageClassName"),
    ],
)
def test_the_crd_writes_no_default_into_per_site_fields(path: tuple[str, ...]) -> None:
    """A CRD default is written into each object at creation: the operator's default could
    never reach it again."""
    node = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    for part in path:
        assert "default" not in node or node["default"] == {}, (path, node.get("default"))
        node = node["properties"][part]
    assert "default" not in node, path


def test_the_crd_still_validates_the_card_resource() -> None:
    acc = (build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
           ["spec"]["properties"]["accelerator"]["properties"])
    assert "pattern" in acc["resourceName"] and acc["resourceName"]["x-kubernetes-validations"]
    assert SpyreModelSpec.model_validate(GENERATE).engine.image is None


def test_the_watch_indices_plan_with_the_operators_defaults(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The indices (which Jobs are needed, who shares a claim) key models as decide() does:
    with the defaults from the flags, else a shared Job under the new image would look
    unneeded."""
    from spyre_operator import handlers

    monkeypatch.setattr(handlers.OperatorConfig, "site", SITE)
    p = handlers._build_plan("ns", "m", "uid-m", GENERATE)
    assert p.key == plan(GENERATE).key
    assert p.spec.engine.image == SITE.engine_image


def test_a_default_added_while_compiling_does_not_roll_the_pods_of_the_previous_artifact() -> None:
    """A new image and a new pull secret at once: the old Deployment keeps its pod template
    (its served spec had no pull secret) until the switch, which rolls once with both."""
    bare = replace(SITE, image_pull_secrets=(), serving_node_selector={})
    m = model("m", GENERATE)
    obs = serving(m, bare)
    before = obs.deployment["spec"]["template"]  # type: ignore[index]
    new = replace(bare, engine_image="registry.example.com/spyre/e:2",
                  image_pull_secrets=("new-registry",), serving_node_selector={"pool": "b"})
    obs.job = None
    d = decide(copy.deepcopy(m), obs, NOW, Policy(site=new))
    dep = next(o for o in d.apply if o.kind == "Deployment").to_dict()
    assert dep["spec"]["template"] == before
    assert d.job is not None
    job_pod = d.job.spec.template.spec
    assert [s.name for s in job_pod.imagePullSecrets] == ["new-registry"], "the compile pulls"


def _pod_sa(plan: Any) -> list[str | None]:
    return [build_precompile_job(plan, [plan.owner]).spec.template.spec.serviceAccountName,
            build_deployment(plan, plan.key).spec.template.spec.serviceAccountName]


def test_service_account_of_the_model_pods_from_spec_or_site() -> None:
    """Issue 28: SCCs and pull secrets are granted to ServiceAccounts; a model's precompile and
    serving pods run as spec.engine.serviceAccountName, else the operator's default, else the
    namespace's default (none set). Never part of the artifact key."""
    spec = SpyreModelSpec.model_validate(GENERATE)
    bare = plan_model("m", "ns", "u", spec)
    assert _pod_sa(bare) == [None, None]
    site = SiteDefaults(service_account_name="spyre-engine")
    by_site = plan_model("m", "ns", "u", spec, site)
    assert _pod_sa(by_site) == ["spyre-engine", "spyre-engine"]
    assert "engine.serviceAccountName" in by_site.from_defaults
    own = SpyreModelSpec.model_validate(
        {**GENERATE, "engine": {"serviceAccountName": "team-a-engine"}})
    mine = plan_model("m", "ns", "u", own, site)
    assert _pod_sa(mine) == ["team-a-engine", "team-a-engine"]
    assert bare.key == by_site.key == mine.key
    # The GC Job keeps its own account (it asks the API server what uses a key).
    from spyre_operator.desired.gcjob import GC_SERVICE_ACCOUNT, build_gc_job

    gc = build_gc_job(mine, [mine.key], [mine.owner]).spec.template.spec
    assert gc.serviceAccountName == GC_SERVICE_ACCOUNT
    # status.effective names it when one is in use.
    m = model("m", {**GENERATE, "engine": {"serviceAccountName": "team-a-engine"}})
    d = decide(m, Observed(cache_pvc=bound()), NOW)
    assert d.status["effective"]["serviceAccountName"] == "team-a-engine"
    m = model("m", GENERATE)
    assert "serviceAccountName" not in decide(m, Observed(cache_pvc=bound()), NOW).status[
        "effective"]


def test_service_account_name_is_checked_at_admission() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        SpyreModelSpec.model_validate({**GENERATE, "engine": {"serviceAccountName": "Bad_Name"}})
