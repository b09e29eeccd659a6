"""Issue 12, operator side: compile off the cards, gated models, accelerator names (pure)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError
from spyre_operator.api import SpyreModelSpec
from spyre_operator.decide import Observed, decide
from spyre_operator.decide import conditions as C

from .samples import GENERATE, model
from .test_reconcile import NOW, cond, deployment_obj, job_obj
from .test_reconcile_correctness import bound


def container(pod_spec: Any) -> Any:
    return pod_spec.containers[0]


def arg(c: Any, flag: str) -> str:
    return str(c.args[c.args.index(flag) + 1])


def env(c: Any) -> dict[str, Any]:
    return {e.name: e for e in c.env}


def built(spec: dict[str, Any]) -> tuple[Any, Any]:
    """(precompile Job pod spec, serving Deployment pod spec) for ``spec``."""
    m = model("m", spec)
    job = decide(m, Observed(cache_pvc=bound()), NOW).job
    obs = Observed(cache_pvc=bound(), job=job_obj(m, "Complete"))
    dep = next(o for o in decide(m, obs, NOW).apply if o.kind == "Deployment")
    return job.spec.template.spec, dep.spec.template.spec


def test_sendnn_artifacts_compile_off_the_cards_and_serve_on_them() -> None:
    spec = {**GENERATE, "compile": {"tensorParallelSize": 4},
            "accelerator": {"nodeSelector": {"pool": "spyre"}},
            "precompile": {"nodeSelector": {"pool": "cpu"},
                           "tolerations": [{"key": "cpu-only", "operator": "Exists"}]}}
    job, dep = built(spec)
    jc, dc = container(job), container(dep)
    assert arg(jc, "--backend") == "sendnn_compile_only"
    assert env(jc)["SENDNN_INFERENCE_DYNAMO_BACKEND"].value == "sendnn_compile_only"
    assert not (jc.resources.limits or {}) and job.schedulerName is None
    assert job.nodeSelector == {"pool": "cpu"} and job.tolerations[0].key == "cpu-only"
    assert arg(dc, "--backend") == "sendnn"
    assert env(dc)["SENDNN_INFERENCE_DYNAMO_BACKEND"].value == "sendnn"
    assert dc.resources.limits == {"ibm.com/spyre_vf": "4"}
    assert dep.schedulerName == "spyre-scheduler" and dep.nodeSelector == {"pool": "spyre"}
    # the same artifact key whichever way it was compiled
    on_cards = {**spec, "precompile": {"onCards": True}}
    assert (decide(model("m", on_cards), Observed(), NOW).status["artifact"]["key"]
            == decide(model("m", spec), Observed(), NOW).status["artifact"]["key"])


def test_compiling_on_the_cards_is_an_opt_in() -> None:
    job, _ = built({**GENERATE, "precompile": {"onCards": True}})
    jc = container(job)
    assert arg(jc, "--backend") == "sendnn"
    assert jc.resources.limits == {"ibm.com/spyre_vf": "1"}
    assert job.schedulerName == "spyre-scheduler"


@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_cpu_backends_use_no_cards_and_no_spyre_scheduler_anywhere(backend: str) -> None:
    job, dep = built({**GENERATE, "compile": {"backend": backend},
                      "precompile": {"onCards": True}})
    for pod in (job, dep):
        assert not (container(pod).resources.limits or {})
        assert pod.schedulerName is None
        assert arg(container(pod), "--backend") == backend


def crd_messages() -> str:
    import yaml
    from spyre_operator.gen.crd import render_crd

    return json.dumps(yaml.safe_load(render_crd()))


def test_sendnn_compile_only_cannot_serve() -> None:
    # the API server rejects it (CEL; tests/integration/test_reconcile_correctness.py)
    assert "sendnn_compile_only cannot serve" in crd_messages()


def test_gated_model_token_and_download_settings_reach_only_the_job() -> None:
    spec = {**GENERATE, "model": {**GENERATE["model"],
                                  "tokenSecret": {"name": "hf", "key": "token"},
                                  "downloadEnv": [{"name": "HF_ENDPOINT",
                                                   "value": "https://mirror.internal"}],
                                  "caBundle": {"name": "corp-ca", "key": "ca.crt"}}}
    job, dep = built(spec)
    je, de = env(container(job)), env(container(dep))
    assert je["HF_TOKEN"].valueFrom.secretKeyRef.name == "hf"
    assert je["HF_ENDPOINT"].value == "https://mirror.internal"
    assert je["REQUESTS_CA_BUNDLE"].value.endswith("/ca.crt")
    assert any(v.configMap and v.configMap.name == "corp-ca" for v in job.volumes)
    for name in ("HF_TOKEN", "HF_ENDPOINT", "REQUESTS_CA_BUNDLE"):
        assert name not in de
    assert de["HF_HUB_OFFLINE"].value == "1"
    assert not any(v.configMap for v in dep.volumes or [])
    # none of it changes the artifact
    assert (decide(model("m", spec), Observed(), NOW).status["artifact"]["key"]
            == decide(model("m", GENERATE), Observed(), NOW).status["artifact"]["key"])


def test_download_env_cannot_smuggle_the_token() -> None:
    assert "must not set HF_TOKEN (use model.tokenSecret)" in crd_messages()


@pytest.mark.parametrize("reason", ["ModelAccessDenied", "ModelNotFound",
                                    "UnsupportedConfiguration", "UnsupportedBase",
                                    "InsufficientCacheSpace"])
def test_engine_reasons_users_must_act_on_reach_the_conditions(reason: str) -> None:
    m = model("m", GENERATE)
    failure = {"reason": reason, "message": "401 Client Error for ibm-granite/granite (gated)"}
    obs = Observed(cache_pvc=bound(), job=job_obj(m, "Failed"),
                   job_pods=[{"name": "p", "terminated": {"exitCode": 1,
                                                          "message": json.dumps(failure)}}])
    d = decide(m, obs, NOW)
    for t in (C.READY, C.ARTIFACT_READY, C.DEGRADED):
        assert cond(d, t)["reason"] == reason, t
    assert "gated" in cond(d, C.DEGRADED)["message"]
    assert reason in C.WARNING_REASONS


def test_resolved_revision_is_recorded() -> None:
    m = model("m", GENERATE)
    summary = {"key": "k", "path": "/cache/x", "compileSeconds": 1, "sizeBytes": 1,
               "modelRevision": "0123abcd" * 5}
    obs = Observed(cache_pvc=bound(), job=job_obj(m, "Complete"),
                   job_pods=[{"name": "p", "terminated": {"exitCode": 0,
                                                          "message": json.dumps(summary)}}])
    assert decide(m, obs, NOW).status["artifact"]["modelRevision"] == "0123abcd" * 5
    assert deployment_obj  # (shared helper, imported for symmetry with the other tests)


def test_extended_resource_names_are_validated() -> None:
    with pytest.raises(ValidationError):  # kubernetes.io/... is CEL's (integration tests)
        SpyreModelSpec.model_validate({**GENERATE, "accelerator": {"resourceName": "spyre"}})


def test_known_configurations_are_required_unless_opted_out() -> None:
    job, _ = built(GENERATE)
    assert "--no-require-known-config" not in container(job).args
    relaxed = {**GENERATE, "compile": {"requireKnownConfiguration": False}}
    job, _ = built(relaxed)
    assert "--no-require-known-config" in container(job).args
    key = decide(model("m", GENERATE), Observed(), NOW).status["artifact"]["key"]
    assert decide(model("m", relaxed), Observed(), NOW).status["artifact"]["key"] != key


def test_site_model_configs_reach_the_job_and_the_servers() -> None:
    spec = {**GENERATE, "compile": {"modelConfigFile": {"name": "site-configs",
                                                        "key": "model_configs.yaml"}}}
    job, dep = built(spec)
    for pod in (job, dep):
        e = env(container(pod))["SENDNN_INFERENCE_MODEL_CONFIG_FILE"].value
        assert e.endswith("/model_configs.yaml")
        assert any(v.configMap and v.configMap.name == "site-configs" for v in pod.volumes)
    key = decide(model("m", GENERATE), Observed(), NOW).status["artifact"]["key"]
    assert decide(model("m", spec), Observed(), NOW).status["artifact"]["key"] != key


def test_production_sample_compiles_off_the_cards_and_serves_on_them() -> None:
    from pathlib import Path

    import yaml

    doc = yaml.safe_load((Path(__file__).parents[2] / "operator" / "samples"
                          / "granite-production.yaml").read_text())
    job, dep = built(doc["spec"])
    assert arg(container(job), "--backend") == "sendnn_compile_only"
    assert not (container(job).resources.limits or {}).get("ibm.com/spyre_pf")
    assert job.schedulerName is None and "HF_TOKEN" in env(container(job))
    assert arg(container(dep), "--backend") == "sendnn"
    assert container(dep).resources.limits["ibm.com/spyre_pf"] == "4"
    assert dep.schedulerName == "spyre-scheduler" and "HF_TOKEN" not in env(container(dep))


@pytest.mark.parametrize(
    ("resource", "device"),
    [("ibm.com/spyre_vf", "VF"), ("ibm.com/spyre_pf", "PF"), ("ibm.com/spyre_pf_tier1", "PF"),
     ("ibm.com/aiu_pf", "PF")],
)  # fmt: skip
def test_flex_device_follows_the_card_resource(resource: str, device: str) -> None:
    """Upstream's image bakes FLEX_DEVICE=PF and documents PF and VF as separate settings; the
    device plugin gives a pod the kind its resource names, so the pods on the cards say which.
    A compile-only Job has none (the engine sets COMPILE), nor do CPU backends."""
    spec = {**GENERATE, "accelerator": {"resourceName": resource}}
    job, dep = built(spec)
    assert env(container(dep))["FLEX_DEVICE"].value == device
    assert "FLEX_DEVICE" not in env(container(job))
    on_cards, _ = built({**spec, "precompile": {"onCards": True}})
    assert env(container(on_cards))["FLEX_DEVICE"].value == device
    cpu_job, cpu_dep = built({**spec, "compile": {"backend": "inductor"}})
    assert "FLEX_DEVICE" not in env(container(cpu_dep))
    # the user cannot set another one (the API server refuses it, like every operator variable)
    assert "'FLEX_DEVICE'" in crd_messages()
