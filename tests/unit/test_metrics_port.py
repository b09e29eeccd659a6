"""serving.metricsPort: /metrics on a port of its own (``metrics``), so a NetworkPolicy can admit
Prometheus to the metrics without the API (the policy: test_network_policy.py). The engine's
side, on a real engine (404 on the serving port, the series on the metrics port):
tests/engine/test_serve.py; on the real node: the prefix-cache test of
tests/realpods/test_disruption.py."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError
from spyre_operator.api import SpyreModelSpec
from spyre_operator.desired import names
from spyre_operator.desired.deployment import build_deployment
from spyre_operator.desired.plan import plan_model
from spyre_operator.desired.service import build_service

from .samples import GENERATE, SITE


def plan(spec: dict[str, Any]) -> Any:
    return plan_model("m", "ns", "uid-m", SpyreModelSpec.model_validate(spec), SITE)


OWN_PORT = {**GENERATE, "serving": {"metricsPort": 9400}}


def test_the_engine_serves_metrics_on_the_declared_port() -> None:
    p = plan(OWN_PORT)
    pod = build_deployment(p, p.key).spec.template
    (c,) = pod.spec.containers
    assert c.args[c.args.index("--metrics-port") + 1] == "9400"
    assert {(q.name, q.containerPort) for q in c.ports} == {("http", 8000), ("metrics", 9400)}
    # the chart's PodMonitor skips the http port of such pods (/metrics answers 404 there)
    assert pod.metadata.annotations[names.METRICS_PORT_ANNOTATION] == "9400"
    ports = {(q.name, q.port, q.targetPort) for q in build_service(p).spec.ports}
    assert ports == {("http", 8000, "http"), ("metrics", 9400, "metrics")}


def test_unset_keeps_metrics_on_the_serving_port() -> None:
    p = plan(GENERATE)
    pod = build_deployment(p, p.key).spec.template
    (c,) = pod.spec.containers
    assert "--metrics-port" not in c.args
    assert [q.name for q in c.ports] == ["http"]
    assert names.METRICS_PORT_ANNOTATION not in (pod.metadata.annotations or {})
    assert [q.name for q in build_service(p).spec.ports] == ["http"]


def test_the_metrics_port_is_not_part_of_the_artifact_key() -> None:
    assert plan(OWN_PORT).key == plan(GENERATE).key


@pytest.mark.parametrize("port", [80, 70000])
def test_out_of_range_is_refused(port: int) -> None:
    with pytest.raises(ValidationError, match="metrics_port|metricsPort"):
        SpyreModelSpec.model_validate({**GENERATE, "serving": {"metricsPort": port}})


def test_at_zero_the_engine_service_has_the_metrics_port_and_the_interceptors_not() -> None:
    """A scale-to-zero model: ``<model>-engine`` selects the pods (a ServiceMonitor's way to
    the metrics port); the model's own Service is the interceptor's, which has no metrics."""
    from spyre_operator.desired.scaletozero import (
        build_engine_service,
        build_interceptor_service,
    )

    spec = {**OWN_PORT, "autoscaling": {"minReplicas": 0, "maxReplicas": 2,
                                        "targetQueueLength": 2}}
    p = plan(spec)
    assert [q.name for q in build_engine_service(p).spec.ports] == ["http", "metrics"]
    assert [q.name for q in build_interceptor_service(p).spec.ports] == ["http"]
