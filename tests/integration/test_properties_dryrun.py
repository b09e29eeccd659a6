"""Any spec the CRD accepts builds objects the API server accepts (hypothesis, issue 6).

Each generated spec (``tests.unit.test_properties.specs``) is first submitted as a SpyreModel
and then every object the builders make from it (cache PVC, precompile Job, Deployment,
Service, PodDisruptionBudget) is submitted, all with a server-side dry run: the API server
validates and admits them (PodSecurity ``restricted`` included, as warnings for workloads)
without storing anything.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from spyre_operator.api import SpyreModelSpec
from spyre_operator.desired.deployment import build_deployment
from spyre_operator.desired.job import build_precompile_job
from spyre_operator.desired.plan import plan_model
from spyre_operator.desired.pvc import build_cache_pvc, cache_owners
from spyre_operator.desired.service import build_pdb, build_service, wants_pdb

from tests.cluster.controlplane import ControlPlane
from tests.unit.test_properties import specs

pytestmark = pytest.mark.integration

GROUP = "serving.spyre.dev"
UID = "3f0e7b4c-0000-4000-8000-000000000001"


def dry_run(
    cp: ControlPlane, ns: str, objs: list[dict[str, Any]]
) -> subprocess.CompletedProcess[str]:
    doc = {"apiVersion": "v1", "kind": "List", "items": objs}
    return cp.kubectl("apply", "-n", ns, "--server-side", "--dry-run=server",
                      "--field-manager=dryrun", "-f", "-", input=json.dumps(doc), check=False)


def children(name: str, ns: str, spec: SpyreModelSpec) -> list[dict[str, Any]]:
    plan = plan_model(name, ns, UID, spec)
    objs = [build_precompile_job(plan, [plan.owner]), build_deployment(plan, plan.key),
            build_service(plan)]
    if wants_pdb(plan):
        objs.append(build_pdb(plan))
    if plan.claim_managed and plan.volume is not None:
        objs.append(build_cache_pvc(ns, plan.volume, cache_owners([(plan.owner, plan.volume)])))
    return [o.to_dict() for o in objs]


def test_generated_specs_build_objects_the_api_server_accepts(
    control_plane: ControlPlane, namespace: str, crd: Any
) -> None:
    seen = {"n": 0}

    # no shrinking: each step is an API round trip (minutes for a failure); the report
    # prints the failing spec as generated
    @settings(max_examples=25, deadline=None, derandomize=True,
              phases=[Phase.explicit, Phase.reuse, Phase.generate],
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
    @given(specs())
    # found by this test: env the CRD admitted but the operator sets too (a duplicate key);
    # the CRD now rejects every name the operator sets (api.v1alpha1.OPERATOR_ENV)
    @example({"model": {"uri": "hf://o/m"}, "serving": {"env": [
        {"name": "LOG_LEVEL", "value": "0"}, {"name": "DT_OPT", "value": "x"}]}})
    # the download settings, a single-node cache (pod affinity) and a precompile placement
    @example({"model": {"uri": "hf://o/m", "tokenSecret": {"name": "hf"},
                        "downloadEnv": [{"name": "HF_ENDPOINT", "value": "https://m.internal"}],
                        "caBundle": {"name": "ca", "key": "ca.crt"}},
              "compile": {"modelConfigFile": {"name": "cfg", "key": "model_configs.yaml"},
                          "requireKnownConfiguration": False},
              "cache": {"volume": {"accessModes": ["ReadWriteOnce"]}},
              "precompile": {"nodeSelector": {"pool": "cpu"},
                             "tolerations": [{"key": "cpu", "operator": "Exists"}]}})
    def check(spec: dict[str, Any]) -> None:
        seen["n"] += 1
        model = {"apiVersion": f"{GROUP}/v1alpha1", "kind": "SpyreModel",
                 "metadata": {"name": "m"}, "spec": spec}
        r = dry_run(control_plane, namespace, [model])
        assert r.returncode == 0, f"the CRD rejected a generated spec: {r.stderr}\n{spec}"
        objs = children("m", namespace, SpyreModelSpec.model_validate(spec))
        r = dry_run(control_plane, namespace, objs)
        assert r.returncode == 0, f"the API server rejected a built object: {r.stderr}\n{spec}"

    check()
    assert seen["n"] >= 10
