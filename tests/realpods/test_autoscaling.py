"""Autoscaling on the engine's own load, end to end on the real node (issue 13, part 1).

A SpyreModel with ``autoscaling`` (queue length target 1 per pod, 1..2 replicas) serves the
tiny model; the operator owns the HPA, which scales the model's ``/scale``. The metric comes
the production way (tests/cluster/metrics.py): a real Prometheus scrapes the engine pods,
prometheus-adapter serves ``custom.metrics.k8s.io``, the controller manager's HPA controller
reads it. Nothing is injected.

1. Load (several clients, long completions, at most 2 sequences per engine) makes requests
   queue: the HPA scales 1 -> 2, the second pod becomes Ready from the existing artifact (no
   new precompile Job, same artifact label), and the model stays Ready throughout.
2. The load stops: the HPA scales back to 1 after the (short, for the test) stabilisation.

The figures (metric over target -> new pod serving; the new pod's start against the first
pod's compile + start) are printed; the benchmark reports them side by side.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from spyre_operator.decide import conditions as C
from spyre_operator.desired import names

from tests.cluster.metrics import MetricsStack
from tests.contract.realpods import (
    RealEnv,
    Steady,
    failures,
    model_spec,
    real_env_fixture,
    server_pods,
    wait_ready,
)
from tests.realpods import support

pytestmark = [pytest.mark.realpods, pytest.mark.integration, pytest.mark.timeout(1500)]

env = real_env_fixture("hpa")

MODEL = "auto"
QUEUE_METRIC = "vllm_num_requests_waiting"
CLIENTS = 6


@pytest.fixture(scope="module")
def stack(env: RealEnv) -> Any:
    s = MetricsStack(env.cp)
    t0 = time.monotonic()
    s.up()
    print(f"Prometheus + prometheus-adapter serving custom.metrics.k8s.io in "
          f"{time.monotonic() - t0:.0f}s")
    yield s
    s.down()


def _spec(env: RealEnv) -> dict[str, Any]:
    return model_spec(env.image, replicas=1, autoscaling={
        "minReplicas": 1, "maxReplicas": 2, "targetQueueLength": 1,
        "scaleDownStabilizationSeconds": 15,
    })  # fmt: skip


def _ready_pods(env: RealEnv) -> list[dict[str, Any]]:
    return [p for p in server_pods(env.kube, MODEL)
            if support.pod_ready(p) and not p["metadata"].get("deletionTimestamp")]


def _wait(what: str, predicate: Any, timeout: float, env: RealEnv, stack: MetricsStack) -> Any:
    def detail() -> str:
        hpa = env.kube.get("horizontalpodautoscaler", names.server_name(MODEL))
        return (f"HPA status: {(hpa or {}).get('status')}\n"
                f"queue metric: {stack.custom_metric(env.ns, QUEUE_METRIC)}\n"
                f"target discovery error: {stack.discovery_error!r}")

    return support.wait_for(env.cp, env.ns, MODEL, what, predicate, timeout, detail)


def test_queueing_requests_scale_the_model_up_from_its_artifact_and_back_down(
    env: RealEnv, stack: MetricsStack
) -> None:
    t0 = time.monotonic()
    env.kube.apply_model(MODEL, _spec(env))
    model = wait_ready(env.kube, MODEL)
    first_ready = time.monotonic() - t0
    key = model["status"]["servingArtifactKey"]
    jobs_before = {j["metadata"]["name"] for j in support.jobs(env.cp, env.ns)}
    hpa = env.kube.get("horizontalpodautoscaler", names.server_name(MODEL))
    assert hpa is not None and hpa["spec"]["scaleTargetRef"]["kind"] == "SpyreModel"

    # The pipeline serves the engine's metric for the pod before any load.
    _wait("the queue metric served for the first pod",
          lambda: stack.custom_metric(env.ns, QUEUE_METRIC), 180, env, stack)

    url = support.service_url(env.cp, env.ns, MODEL)
    env.client.wait_routed(url)
    clients = [Steady(env.client, url, max_tokens=96, pause=0.0) for _ in range(CLIENTS)]
    try:
        crossed = _wait("requests queueing (metric over target)",
                        lambda: max(stack.custom_metric(env.ns, QUEUE_METRIC).values(),
                                    default=0) > 1 and time.monotonic(), 300, env, stack)
        _wait("the HPA writing replicas 2 through /scale",
              lambda: env.kube.model(MODEL)["spec"]["replicas"] == 2, 300, env, stack)
        scaled = time.monotonic()
        _wait("a second Ready serving pod", lambda: len(_ready_pods(env)) == 2, 600, env, stack)
        serving2 = time.monotonic()
        pods = _ready_pods(env)
        assert {p["metadata"]["labels"][names.ARTIFACT_LABEL] for p in pods} == {
            names.short_key(key)}
        assert {j["metadata"]["name"] for j in support.jobs(env.cp, env.ns)} == jobs_before, (
            "scaling up ran a precompile Job")
        m = env.kube.model(MODEL)
        assert support.condition(m, C.READY)["status"] == "True"
        auto = support.condition(m, C.AUTOSCALING)
        assert auto is not None and auto["status"] == "True", auto
        print(f"scale-up: metric over target -> replicas 2 in {scaled - crossed:.0f}s, "
              f"-> second pod Ready in {serving2 - crossed:.0f}s; first replica "
              f"(compile + start) {first_ready:.0f}s")
    finally:
        t1 = time.monotonic()  # the load stops (the clients finish what they sent)
        results = [r for c in clients for r in c.stop()]
    print(f"{len(results)} requests under load, {len(failures(results))} failed")
    assert not failures(results), failures(results)[:3]

    # Load gone: back to one replica after the stabilisation window.
    _wait("the HPA scaling back to 1",
          lambda: env.kube.model(MODEL)["spec"]["replicas"] == 1, 420, env, stack)
    _wait("one serving pod left", lambda: len(server_pods(env.kube, MODEL)) == 1, 300, env, stack)
    print(f"scale-down: load stopped -> 1 replica in {time.monotonic() - t1:.0f}s")
    assert support.condition(env.kube.model(MODEL), C.READY)["status"] == "True"
