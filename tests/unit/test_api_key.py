"""serving.apiKey: the serving container gets the key vLLM checks (VLLM_API_KEY) from the
Secret; the precompile Job never sees it and the artifact key does not depend on it (a key
rotation or adding one rolls the pods, never recompiles). The engine's real 401/200:
tests/engine/test_dashboard_metrics.py."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError
from spyre_operator.api import SpyreModelSpec
from spyre_operator.desired.deployment import build_deployment
from spyre_operator.desired.job import build_precompile_job
from spyre_operator.desired.plan import plan_model

from .samples import GENERATE, SITE


def plan(spec: dict[str, Any]) -> Any:
    return plan_model("m", "ns", "uid-m", SpyreModelSpec.model_validate(spec), SITE)


WITH_KEY = {**GENERATE, "serving": {"apiKey": {"name": "m-api-key"}}}


def env(container: Any) -> dict[str, Any]:
    return {e.name: e for e in container.env or []}


def test_the_serving_container_reads_the_key_from_the_secret() -> None:
    p = plan(WITH_KEY)
    (c,) = build_deployment(p, p.key).spec.template.spec.containers
    ref = env(c)["VLLM_API_KEY"].valueFrom.secretKeyRef
    assert (ref.name, ref.key) == ("m-api-key", "api-key")
    assert env(c)["VLLM_API_KEY"].value is None, "never the key itself in the Deployment"
    other = plan({**GENERATE, "serving": {"apiKey": {"name": "s", "key": "token"}}})
    (c,) = build_deployment(other, other.key).spec.template.spec.containers
    assert env(c)["VLLM_API_KEY"].valueFrom.secretKeyRef.key == "token"


def test_without_it_no_check() -> None:
    p = plan(GENERATE)
    (c,) = build_deployment(p, p.key).spec.template.spec.containers
    assert "VLLM_API_KEY" not in env(c)


def test_no_recompile_and_the_job_never_sees_it() -> None:
    p, q = plan(GENERATE), plan(WITH_KEY)
    assert p.key == q.key
    (c,) = build_precompile_job(q, [q.owner]).spec.template.spec.containers
    assert "VLLM_API_KEY" not in env(c)


def test_env_may_not_set_it_beside_api_key() -> None:
    """The CRD's CEL rule (checked by the API server in tests/integration); the pydantic model
    accepts it, the builder's merge keeps the operator's value."""
    spec = {**GENERATE, "serving": {"apiKey": {"name": "k"},
                                    "env": [{"name": "VLLM_API_KEY", "value": "plain"}]}}
    from spyre_operator.api.v1alpha1 import ServingSpec
    rules = ServingSpec.model_json_schema()["x-kubernetes-validations"]
    assert any("VLLM_API_KEY" in r["rule"] for r in rules), rules
    with pytest.raises(ValidationError):
        SpyreModelSpec.model_validate({**GENERATE, "serving": {"apiKey": {"name": ""}}})
    p = plan(spec)
    (c,) = build_deployment(p, p.key).spec.template.spec.containers
    assert env(c)["VLLM_API_KEY"].value is None
