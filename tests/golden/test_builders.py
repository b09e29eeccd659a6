"""Golden YAML for every builder; regenerate with `pytest tests/golden --update-golden`.

A reviewer reads the diff of tests/golden/data/ to see exactly what a change does to the
objects the operator writes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from spyre_operator.api import SpyreModelSpec
from spyre_operator.desired.deployment import build_canary_deployment, build_deployment
from spyre_operator.desired.devices import build_cards_template
from spyre_operator.desired.inference_pool import build_inference_pool
from spyre_operator.desired.job import build_precompile_job
from spyre_operator.desired.plan import plan_model
from spyre_operator.desired.pvc import build_cache_pvc, cache_owners
from spyre_operator.desired.scaletozero import (
    build_engine_service,
    build_http_scaled_object,
    build_scaled_object,
)
from spyre_operator.desired.service import build_pdb, build_service
from spyre_operator.desired.verified import build_verified_configmap

from ..unit.samples import ALL, ON_DEVICE_CLASS, SITE, UNDER_SITE

DATA = Path(__file__).parent / "data"

#: The samples rendered once more with scale to zero, and the addresses the operator's
#: configuration would pass (KEDA's HTTP add-on scaler, Prometheus, our cold-start responder).
SCALE_TO_ZERO_SAMPLES = ("generate",)
#: The samples rendered once more with a canary (spec.serving.canary): its Deployment.
CANARY_SAMPLES = ("generate",)
CANARY: dict[str, Any] = {"replicas": 1, "durationSeconds": 600, "maxErrorRatio": 0.02,
                          "minRequests": 20, "maxMeanLatencySeconds": 4.5}
SCALE_TO_ZERO: dict[str, Any] = {
    "minReplicas": 0, "maxReplicas": 4, "targetQueueLength": 2, "targetKvCacheUsage": 0.8,
    "scaleToZero": {"idleSeconds": 600, "maxWaitSeconds": 240},
}
SCALER = "keda-add-ons-http-external-scaler.keda:9090"
PROMETHEUS = "http://prometheus-operated.monitoring.svc:9090"
COLDSTART = ("spyre-model-operator-coldstart", 8082)


def render(sample: str, spec_doc: dict[str, Any]) -> dict[str, Any]:
    spec = SpyreModelSpec.model_validate(spec_doc)
    if sample in UNDER_SITE:
        # The admin's defaults for the unset fields; the PVC's StorageClass default applies
        # only when it is created (decide_cache, in tests/unit/test_site_defaults.py).
        plan = plan_model(sample, "team-a", f"uid-{sample}", spec, SITE)
        return {k: build(plan).to_dict() for k, build in (
            ("job", lambda p: build_precompile_job(p, [p.owner])),
            ("deployment", lambda p: build_deployment(p, p.key)),
            ("service", build_service),
        )}
    if sample in ON_DEVICE_CLASS:
        plan = plan_model(sample, "team-a", f"uid-{sample}", spec)
        return {k: build(plan).to_dict() for k, build in (
            ("job", lambda p: build_precompile_job(p, [p.owner])),
            ("deployment", lambda p: build_deployment(p, p.key)),
            ("cardstemplate", build_cards_template),
        )}
    plan = plan_model(sample, "team-a", f"uid-{sample}", spec)
    objs: dict[str, Any] = {
        "job": build_precompile_job(plan, [plan.owner]),
        "deployment": build_deployment(plan, plan.key),
        "service": build_service(plan),
        "pdb": build_pdb(plan),
    }
    if plan.claim_managed and plan.volume is not None:
        objs["pvc"] = build_cache_pvc(
            "team-a", plan.volume, cache_owners([(plan.owner, plan.volume)])
        )
    # the same model routed through an inference gateway (routing changes no other object)
    routed = SpyreModelSpec.model_validate(
        {**spec_doc, "routing": {"inferencePool": {"endpointPicker": {"name": f"{sample}-epp"}}}}
    )
    objs["inferencepool"] = build_inference_pool(
        plan_model(sample, "team-a", f"uid-{sample}", routed)
    )
    # the same model allowed to scale to zero (KEDA + HTTP add-on objects)
    if sample in SCALE_TO_ZERO_SAMPLES:
        s2z = plan_model(
            sample, "team-a", f"uid-{sample}",
            SpyreModelSpec.model_validate({**spec_doc, "autoscaling": SCALE_TO_ZERO}),
        )
        objs["engineservice"] = build_engine_service(s2z)
        objs["httpscaledobject"] = build_http_scaled_object(
            s2z, failover_service=COLDSTART[0], failover_port=COLDSTART[1]
        )
        objs["scaledobject"] = build_scaled_object(
            s2z, scaler_address=SCALER, prometheus_address=PROMETHEUS
        )
    if sample in CANARY_SAMPLES:
        serving = {**(spec_doc.get("serving") or {}), "canary": CANARY}
        canary = plan_model(sample, "team-a", f"uid-{sample}",
                            SpyreModelSpec.model_validate({**spec_doc, "serving": serving}))
        objs["canary"] = build_canary_deployment(canary, canary.key)
        objs["outputcheck"] = build_verified_configmap(canary, canary.key)
    return {k: v.to_dict() for k, v in objs.items()}


KINDS = ("job", "deployment", "service", "pdb", "pvc", "inferencepool", "engineservice",
         "httpscaledobject", "scaledobject", "canary", "outputcheck", "cardstemplate")
SAMPLES = {**ALL, **UNDER_SITE, **ON_DEVICE_CLASS}


def _cases() -> list[tuple[str, str]]:
    """Every object a sample renders, and every golden file on disk: a builder that stops
    rendering an object fails its case (the file is still there) instead of skipping it."""
    rendered = {(sample, kind) for sample, doc in SAMPLES.items() for kind in render(sample, doc)}
    on_disk = {tuple(p.name.removesuffix(".yaml").split(".", 1)) for p in DATA.glob("*.yaml")}
    known = {(sample, kind) for sample, kind in on_disk if sample in SAMPLES and kind in KINDS}
    return sorted(rendered | known)  # type: ignore[arg-type]


CASES = _cases()


@pytest.mark.parametrize("sample,kind", CASES)
def test_golden(sample: str, kind: str, update_golden: bool) -> None:
    rendered = render(sample, SAMPLES[sample])
    path = DATA / f"{sample}.{kind}.yaml"
    if kind not in rendered:
        if update_golden:  # the reviewer sees the file go in the diff
            path.unlink()
            return
        pytest.fail(f"{sample} renders no {kind}, but {path.name} pins one: a builder stopped "
                    "rendering it (or, if intended, run --update-golden and review)")
    text = yaml.safe_dump(rendered[kind], sort_keys=True, width=100)
    if update_golden:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    # A missing golden file fails (and is never written without the flag): in CI a deleted file
    # would otherwise pass on the run that recreates it.
    assert path.exists(), f"golden file {path.name} is missing: run --update-golden, review it"
    assert text == path.read_text(), f"{path.name} differs: review and run --update-golden"


def test_every_golden_file_belongs_to_a_case() -> None:
    """A golden file whose sample or kind is gone is stale: it pins nothing."""
    expected = {f"{sample}.{kind}.yaml" for sample in SAMPLES for kind in KINDS}
    stale = sorted(p.name for p in DATA.glob("*.yaml") if p.name not in expected)
    assert not stale, f"stale golden files (remove them): {stale}"
