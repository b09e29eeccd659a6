"""The Spyre plugin's thread count and compile concurrency, pinned by the operator.

The plugin sets each worker's DT_PARALLEL_THREADS ("affects the compilation during warmup",
sendnn_inference/platform.py) from SENDNN_INFERENCE_NUM_CPUS, else from the pod's own cgroup
limit or node; the precompile pod (a CPU node) and the serving pods (a card node) would count
differently. The operator gives both the serving pods' whole CPUs, and hashes them into the
artifact key. SENDNN_INFERENCE_MAX_LOAD_PROCESSES (how many workers load and compile at once)
is precompile.maxLoadProcesses, for the Job only. The plugin side is pinned in
test_spyre_pins.py (thread_drift).
"""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import replace
from typing import Any

import pytest
from pydantic import ValidationError
from spyre_operator.api import SpyreModelSpec
from spyre_operator.cli import build_parser, site_defaults
from spyre_operator.decide import Observed, decide
from spyre_operator.desired.deployment import build_deployment
from spyre_operator.desired.job import build_precompile_job
from spyre_operator.desired.key import artifact_key, engine_cpus, is_compile_env, key_inputs
from spyre_operator.desired.plan import ModelPlan, plan_model
from spyre_operator.desired.site import SiteDefaults
from spyre_operator.gen.crd import build_crd

from .samples import GENERATE, SITE, model
from .test_reconcile import BOUND, NOW, deployment_obj, job_obj

NUM_CPUS = "SENDNN_INFERENCE_NUM_CPUS"
MAX_LOAD = "SENDNN_INFERENCE_MAX_LOAD_PROCESSES"


def with_(spec: dict[str, Any], **sections: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(spec)
    for name, fields in sections.items():
        out.setdefault(name, {}).update(fields)
    return out


def plan(spec: dict[str, Any], site: SiteDefaults | None = None) -> ModelPlan:
    return plan_model("m", "ns", "uid-m", SpyreModelSpec.model_validate(spec), site)


def env(container: Any) -> dict[str, str | None]:
    return {e.name: e.value for e in container.env or []}


def pods(p: ModelPlan) -> tuple[Any, Any]:
    """The precompile Job's container and the serving Deployment's."""
    job = build_precompile_job(p, [p.owner]).spec.template.spec.containers[0]
    dep = build_deployment(p, p.key).spec.template.spec.containers[0]
    return job, dep


#: A server with 8 CPUs (limit) on a card node; the compile on a CPU pool with 32.
BIG_COMPILE = with_(
    GENERATE,
    compile={"tensorParallelSize": 4},
    serving={"resources": {"requests": {"cpu": "4"}, "limits": {"cpu": "8", "memory": "64Gi"}}},
    precompile={"resources": {"requests": {"cpu": "32"}, "limits": {"cpu": "32"}}},
)


@pytest.mark.parametrize("backend,on_cards", [
    ("sendnn", False), ("sendnn", True), ("eager", False), ("inductor", False),
])  # fmt: skip
def test_the_job_and_the_servers_get_the_servers_cpus(backend: str, on_cards: bool) -> None:
    """Whatever the precompile pod's own CPUs and wherever it runs, its plugin counts the
    serving pods' CPUs, so each tensor-parallel worker gets the same DT_PARALLEL_THREADS."""
    spec = with_(BIG_COMPILE, compile={"backend": backend}, precompile={"onCards": on_cards})
    job, dep = pods(plan(spec))
    assert env(job)[NUM_CPUS] == env(dep)[NUM_CPUS] == "8", "the limit, not the request"
    assert job.resources.limits["cpu"] == "32" and dep.resources.limits["cpu"] == "8"


@pytest.mark.parametrize("resources,cpus", [
    ({"limits": {"cpu": "8"}}, 8),
    ({"requests": {"cpu": "6"}, "limits": {"cpu": "12"}}, 12),
    ({"requests": {"cpu": "6"}, "limits": {"memory": "1Gi"}}, 6),  # no cpu limit: the request
    ({"requests": {"cpu": "7500m"}}, 8),  # whole CPUs, rounded up
    ({"requests": {"cpu": "250m"}}, 1),
    ({"requests": {"cpu": 3}}, 3),
    ({"limits": {"memory": "1Gi"}}, None),
    (None, None),
])  # fmt: skip
def test_the_servers_whole_cpus(resources: dict[str, Any] | None, cpus: int | None) -> None:
    spec = with_(GENERATE, serving={"resources": resources} if resources else {})
    assert engine_cpus(SpyreModelSpec.model_validate(spec)) == cpus
    job, dep = pods(plan(spec))
    want = None if cpus is None else str(cpus)
    assert env(job).get(NUM_CPUS) == env(dep).get(NUM_CPUS) == want


def test_without_a_serving_cpu_nothing_changes() -> None:
    """No cpu, no value: the plugin counts each pod's CPUs as before, and the key, hashed
    without it, is the one earlier operators computed."""
    spec = SpyreModelSpec.model_validate(GENERATE)
    assert "engineCpus" not in key_inputs(spec)
    job, dep = pods(plan(GENERATE))
    assert NUM_CPUS not in env(job) and NUM_CPUS not in env(dep)
    assert MAX_LOAD not in env(job) and MAX_LOAD not in env(dep)


def test_the_cpus_are_part_of_the_key() -> None:
    """One Job compiles the artifact of every model with its key: two models whose servers
    have other CPUs get their own artifacts, each compiled with its servers' count."""
    eight, sixteen = plan(BIG_COMPILE), plan(with_(
        BIG_COMPILE, serving={"resources": {"limits": {"cpu": "16"}}}))
    assert eight.key != sixteen.key and eight.job_name != sixteen.job_name
    assert key_inputs(eight.spec)["engineCpus"] == 8
    assert key_inputs(sixteen.spec)["engineCpus"] == 16
    # the same whole CPUs, however spelt, and other resources: the same artifact
    same = plan(with_(BIG_COMPILE, serving={"resources": {"limits": {"cpu": "7200m"},
                                                          "requests": {"memory": "1Gi"}}}))
    assert same.key == eight.key
    # the precompile pod's own CPUs are not: they only make the compile faster or slower
    other_pool = plan(with_(BIG_COMPILE, precompile={"resources": {"requests": {"cpu": "4"}}}))
    assert other_pool.key == eight.key


def test_the_previous_artifact_keeps_its_thread_count_while_the_new_one_compiles() -> None:
    """A serving cpu edit is a new artifact: until it is ready the Deployment serves the old
    one with the old count (built from its served spec), then switches to both new."""
    m = model("m", BIG_COMPILE)
    obs = Observed(cache_pvc=BOUND, job=job_obj(m, "Complete"))
    obs.deployment = deployment_obj(decide(m, obs, NOW), ready=1)
    old_key = plan(BIG_COMPILE).key
    m2 = copy.deepcopy(m)
    m2["spec"] = with_(BIG_COMPILE, serving={"resources": {"limits": {"cpu": "16"}}})
    m2["metadata"]["generation"] = 2
    obs2 = Observed(cache_pvc=BOUND, job=job_obj(m2, None), deployment=obs.deployment)
    d = decide(m2, obs2, NOW)
    dep = next(o for o in d.apply if o.kind == "Deployment")
    assert dep.metadata.annotations["serving.spyre.dev/artifact-key"] == old_key
    assert env(dep.spec.template.spec.containers[0])[NUM_CPUS] == "8"
    assert d.job is not None
    assert env(d.job.spec.template.spec.containers[0])[NUM_CPUS] == "16"
    obs2.job = job_obj(m2, "Complete")
    dep = next(o for o in decide(m2, obs2, NOW).apply if o.kind == "Deployment")
    assert dep.metadata.annotations["serving.spyre.dev/artifact-key"] != old_key
    assert env(dep.spec.template.spec.containers[0])[NUM_CPUS] == "16"


def test_an_artifact_keyed_before_the_thread_count_keeps_its_servers_as_they_were() -> None:
    """After the operator upgrade a model with a serving cpu has a new key and compiles anew;
    its Deployment keeps serving the artifact the earlier operator keyed without the count,
    and is not rolled to add SENDNN_INFERENCE_NUM_CPUS to it (it rolls once, at the switch)."""
    m = model("m", BIG_COMPILE)
    obs = Observed(cache_pvc=BOUND, job=job_obj(m, "Complete"))
    live = deployment_obj(decide(m, obs, NOW), ready=1)
    inputs = key_inputs(SpyreModelSpec.model_validate(BIG_COMPILE))
    del inputs["engineCpus"]  # what the earlier operator hashed
    doc = json.dumps(inputs, sort_keys=True, separators=(",", ":"))
    earlier = hashlib.sha256(doc.encode()).hexdigest()[:32]
    assert earlier != plan(BIG_COMPILE).key
    now = plan(BIG_COMPILE).key
    live = json.loads(json.dumps(live).replace(now, earlier).replace(now[:12], earlier[:12]))
    for c in live["spec"]["template"]["spec"]["containers"]:
        c["env"] = [e for e in c["env"] if e["name"] != NUM_CPUS]
    obs2 = Observed(cache_pvc=BOUND, job=job_obj(m, None), deployment=live)
    d = decide(m, obs2, NOW)
    dep = next(o for o in d.apply if o.kind == "Deployment").to_dict()
    assert dep["metadata"]["annotations"]["serving.spyre.dev/artifact-key"] == earlier
    assert dep["spec"]["template"] == live["spec"]["template"], "no roll at the upgrade"
    assert d.job is not None and env(d.job.spec.template.spec.containers[0])[NUM_CPUS] == "8"


def test_the_thread_count_is_the_operators_and_its_switch_reaches_the_job() -> None:
    """serving.env may not set SENDNN_INFERENCE_NUM_CPUS (serving.resources' cpu does);
    SENDNN_INFERENCE_UPDATE_THREAD_CONFIG=0 (the plugin then sets no thread variable) is
    compile-time env: in the Job too, and in the key."""
    rule = next(
        r for r in build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        ["properties"]["spec"]["properties"]["serving"]["properties"]["env"]
        ["x-kubernetes-validations"] if "operator manages" in r["message"]
    )  # fmt: skip
    assert f"'{NUM_CPUS}'" in rule["rule"] and "serving.resources' cpu" in rule["message"]
    assert not is_compile_env(NUM_CPUS)
    switch = {"name": "SENDNN_INFERENCE_UPDATE_THREAD_CONFIG", "value": "0"}
    spec = with_(BIG_COMPILE, serving={"env": [switch]})
    job, dep = pods(plan(spec))
    assert env(job)[switch["name"]] == env(dep)[switch["name"]] == "0"
    assert plan(spec).key != plan(BIG_COMPILE).key


# ---------------------------------------------------------------- maxLoadProcesses


def test_max_load_processes_is_given_to_the_job_only() -> None:
    spec = with_(BIG_COMPILE, precompile={"maxLoadProcesses": 2})
    job, dep = pods(plan(spec))
    assert env(job)[MAX_LOAD] == "2"
    assert MAX_LOAD not in env(dep)
    assert plan(spec).key == plan(BIG_COMPILE).key, "how many compile at once, not what"
    job, _ = pods(plan(with_(BIG_COMPILE, precompile={"maxLoadProcesses": 0})))
    assert env(job)[MAX_LOAD] == "0", "0, given, is given (the plugin's: no limit)"


def test_the_servers_keep_their_own_max_load_processes() -> None:
    """serving.env may still set it for the serving pods; precompile's is the Job's."""
    spec = with_(BIG_COMPILE, precompile={"maxLoadProcesses": 1},
                 serving={"env": [{"name": MAX_LOAD, "value": "4"}]})
    job, dep = pods(plan(spec))
    assert env(job)[MAX_LOAD] == "1" and env(dep)[MAX_LOAD] == "4"
    assert [e.name for e in job.env].count(MAX_LOAD) == 1


def test_max_load_processes_is_a_whole_number_of_zero_or_more() -> None:
    field = (build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
             ["spec"]["properties"]["precompile"]["properties"]["maxLoadProcesses"])  # fmt: skip
    assert field["type"] == "integer" and field["minimum"] == 0 and "default" not in field
    for bad in (-1, 1.5, "two"):
        with pytest.raises(ValidationError):
            SpyreModelSpec.model_validate(with_(GENERATE, precompile={"maxLoadProcesses": bad}))


def test_the_operators_default_max_load_processes() -> None:
    """--default-precompile-max-load-processes: for models that leave it unset."""
    args = build_parser().parse_args(["run", "--default-precompile-max-load-processes", "1"])
    site = site_defaults(args, scc_probe=lambda: False)
    assert site.precompile_max_load_processes == 1
    p = plan(BIG_COMPILE, site)
    job, dep = pods(p)
    assert env(job)[MAX_LOAD] == "1" and MAX_LOAD not in env(dep)
    assert "precompile.maxLoadProcesses" in p.from_defaults
    own = plan(with_(BIG_COMPILE, precompile={"maxLoadProcesses": 4}), site)
    assert env(pods(own)[0])[MAX_LOAD] == "4"
    assert "precompile.maxLoadProcesses" not in own.from_defaults
    # none given: nothing set, and nothing the model follows
    none = plan(BIG_COMPILE, SITE)
    assert MAX_LOAD not in env(pods(none)[0])
    assert "precompile.maxLoadProcesses" not in none.from_defaults
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--default-precompile-max-load-processes", "-1"])
    assert replace(SITE, precompile_max_load_processes=2).for_served_spec() \
        .precompile_max_load_processes is None, "servers never get it"


def test_artifact_key_still_has_its_shape() -> None:
    k = artifact_key(SpyreModelSpec.model_validate(BIG_COMPILE))
    assert len(k) == 32 and all(c in "0123456789abcdef" for c in k)
