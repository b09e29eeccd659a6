"""Scale to zero in the controller (fake caches and watches), the flags and the responder."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from spyre_operator.cli import main as cli_main
from spyre_operator.control.controller import Caches, Controller
from spyre_operator.decide import API_NOT_SERVED, API_SERVED
from spyre_operator.decide import conditions as C
from spyre_operator.desired import names
from spyre_operator.runtime.coldstart import NAME_HEADER, NAMESPACE_HEADER, make_app, starting

from .test_scaletozero_reconcile import CONFIG, INTERCEPTOR_SLICE, s2z

OURS = {"labels": {"app.kubernetes.io/managed-by": "spyre-model-operator"},
        "ownerReferences": [{"kind": "SpyreModel", "name": "granite", "controller": True}]}


class FakeWatch:
    def __init__(self, state: str, objs: dict[tuple[str, str], dict[str, Any]] | None = None,
                 message: str = "") -> None:
        self.state, self.message, self.cache = state, message, objs or {}

    def get(self, ns: str, name: str) -> dict[str, Any] | None:
        return self.cache.get((ns, name))


def body(name: str, meta: dict[str, Any] | None = None, **kw: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", **(meta or {})}, **kw}


def controller(models: dict[Any, Any], **indices: Any) -> Controller:
    c = Controller(client=None, caches=Caches({"models": models, **indices}))  # type: ignore[arg-type]
    c.scale_to_zero = CONFIG
    return c


def observe(c: Controller) -> Any:
    return c.observer.observe(body("granite"), "cache", "key", "job", None)


def test_observe_reads_keda_objects_services_and_the_mirror_from_the_caches() -> None:
    other_slice = {**INTERCEPTOR_SLICE, "metadata": {
        "name": "admin-x", "namespace": "keda",
        "labels": {"kubernetes.io/service-name": "keda-add-ons-http-interceptor-admin"}}}
    proxy_slice = {**INTERCEPTOR_SLICE, "metadata": {
        **INTERCEPTOR_SLICE["metadata"],
        "labels": {"kubernetes.io/service-name": "keda-add-ons-http-interceptor-proxy"}}}
    c = controller(
        {}, services={("ns", "granite-engine"): [body("granite-engine", OURS)],
                      ("ns", "granite-coldstart"): [body("granite-coldstart", {})]},
        endpointslices={("ns", "granite-interceptor"): [body("granite-interceptor", OURS)]},
    )
    c.scaled_objects = FakeWatch(API_SERVED, {("ns", "granite"): body("granite", OURS)})
    c.http_scaled_objects = FakeWatch(API_NOT_SERVED, message="the server could not find it")
    c.interceptor_slices = FakeWatch(API_SERVED, {("keda", "a"): proxy_slice,
                                                  ("keda", "b"): other_slice})
    obs = observe(c)
    assert obs.keda is CONFIG
    assert (obs.scaled_object_api, obs.http_scaled_object_api) == (API_SERVED, API_NOT_SERVED)
    assert obs.http_scaled_object_api_message == "the server could not find it"
    assert obs.scaled_object is not None and obs.http_scaled_object is None
    assert obs.engine_service is not None and obs.mirror_slice is not None
    assert obs.coldstart_service is None  # not ours: never deleted or written over
    assert "granite-coldstart" in (obs.foreign_scale_to_zero or "")
    assert obs.interceptor_slices == [proxy_slice]


def test_a_foreign_engine_service_is_a_conflict_not_ours() -> None:
    c = controller({}, services={("ns", "granite-engine"): [body("granite-engine", {})]})
    obs = observe(c)
    assert obs.engine_service is None and "granite-engine" in (obs.foreign_scale_to_zero or "")


def test_api_appearing_and_interceptor_changes_wake_only_scale_to_zero_models() -> None:
    models = {("ns", "zero"): [{"spec": s2z()}], ("ns", "one"): [{"spec": s2z(min_replicas=1)}]}
    c = controller(models)
    assert c.router.models_wanting_scale_to_zero() == [("ns", "zero")]
    proxy = {"metadata": {"labels": {"kubernetes.io/service-name":
                                     "keda-add-ons-http-interceptor-proxy"}}}
    assert c.router.models_for_interceptor_slice(proxy) == [("ns", "zero")]
    assert c.router.models_for_interceptor_slice({"metadata": {"labels": {}}}) == []


def test_flags_make_the_config(monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    from spyre_operator.cli import scale_to_zero_config

    args = argparse.Namespace(
        keda_scaler_address="s.keda:9090", keda_interceptor_service="keda/proxy",
        keda_interceptor_port_name="", prometheus_address="http://p:9090",
        coldstart_service="spyre-system/op-coldstart:8082", scale_to_zero=True)
    cfg = scale_to_zero_config(args)
    assert cfg.enabled
    assert (cfg.interceptor_namespace, cfg.interceptor_service) == ("keda", "proxy")
    assert (cfg.coldstart_namespace, cfg.coldstart_service, cfg.coldstart_port) == (
        "spyre-system", "op-coldstart", 8082)
    args.coldstart_service = "op-coldstart"
    with pytest.raises(ValueError, match="namespace/name:port"):
        scale_to_zero_config(args)
    assert cli_main(["run", "-n", "ns", "--coldstart-service", "nope"]) == 2
    from spyre_operator.cli import build_parser

    off = build_parser().parse_args(["run", "-n", "ns", "--no-scale-to-zero"])
    assert not scale_to_zero_config(off).enabled
    assert scale_to_zero_config(build_parser().parse_args(["run", "-n", "ns"])).enabled


def _ask(models: dict[tuple[str, str], dict[str, Any]], headers: dict[str, str],
         method: str = "POST", path: str = "/v1/chat/completions",
         ) -> tuple[int, dict[str, str], dict[str, Any]]:
    async def run() -> tuple[int, dict[str, str], dict[str, Any]]:
        app = make_app(lambda ns, name: models.get((ns, name)))
        async with TestClient(TestServer(app)) as client:
            r = await client.request(method, path, headers=headers,
                                     data=json.dumps({"model": "granite", "messages": []}))
            return r.status, dict(r.headers), json.loads(await r.text())
    return asyncio.run(run())


HEADERS = {NAME_HEADER: "granite", NAMESPACE_HEADER: "ns"}
#: A model that may scale to zero (the responder answers only about those).
ZERO = {"autoscaling": {"minReplicas": 0, "maxReplicas": 1}}


def test_responder_says_starting_with_retry_after() -> None:
    status, headers, payload = _ask({("ns", "granite"): {"spec": ZERO, "status": {}}}, HEADERS)
    assert status == 503 and headers["Retry-After"] == "10"
    assert headers["Content-Type"].startswith("application/json")
    assert payload["error"]["type"] == "model_starting"
    assert "ns/granite is starting" in payload["error"]["message"]


def test_responder_says_no_card_when_the_model_cannot_be_scheduled() -> None:
    conds = [{"type": C.PROGRESSING, "status": "True", "reason": C.INSUFFICIENT_CAPACITY,
              "message": "0/1 replicas available; 1 pod cannot be scheduled (Insufficient "
                         "ibm.com/spyre_vf)"}]
    status, headers, payload = _ask({("ns", "granite"): {"spec": ZERO,
                                                          "status": {"conditions": conds}}},
                                    HEADERS, method="GET")  # fmt: skip
    assert status == 503 and headers["Retry-After"] == "60"
    assert payload["error"]["type"] == "insufficient_capacity"
    assert "no Spyre card is available" in payload["error"]["message"]
    # the scheduler's words describe the cluster's nodes: not for a model's clients
    assert "Insufficient" not in payload["error"]["message"], payload


def test_the_responder_says_nothing_about_models_that_do_not_scale_to_zero() -> None:
    """Issue 45, 4: anyone who reaches its port can send the interceptor's headers, for any
    namespace; a model that cannot be at zero is unknown to the responder, on both paths."""
    other = {("team-b", "secret-model"): {"spec": {"replicas": 1}, "status": {}}}
    headers = {NAME_HEADER: "secret-model", NAMESPACE_HEADER: "team-b"}
    status, _, payload = _ask(other, headers)
    assert status == 503 and payload["error"]["type"] == "model_not_found", payload
    status, _, payload = _ask(other, {}, "GET", names.starting_path("team-b", "secret-model"))
    assert status == 404, payload


def test_responder_without_headers_or_model() -> None:
    status, _, payload = _ask({}, {})
    assert status == 503 and payload["error"]["type"] == "model_starting"
    status, _, payload = _ask({}, HEADERS)
    assert status == 503 and payload["error"]["type"] == "model_not_found"


def _starting_model(replicas: int = 1, ready: int = 0, **conds: tuple[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": "granite"}, "spec": {"replicas": replicas, **ZERO},
            "status": {"readyReplicas": ready, "conditions": [
                {"type": t, "status": st, "reason": r} for t, (st, r) in conds.items()]}}


@pytest.mark.parametrize(("m", "expected"), [
    (_starting_model(), True),  # woken (or new): no replica Ready yet
    (_starting_model(ready=1), False),  # up: KEDA's cooldown may begin
    (_starting_model(replicas=0), False),  # at zero
    (_starting_model(Progressing=("True", C.INSUFFICIENT_CAPACITY)), False),  # no card
    (_starting_model(Degraded=("True", C.ENGINE_FAILED)), False),  # a start that failed
    (_starting_model(Degraded=("False", C.AS_EXPECTED),
                     Progressing=("True", C.ROLLING_OUT)), True),
    ({**_starting_model(), "metadata": {"deletionTimestamp": "2026-11-29T00:00:00Z"}}, False),
    ({"spec": {}}, True),  # replicas defaults to 1, no status yet
])
def test_starting_is_a_wake_up_that_nothing_stopped(m: dict[str, Any], expected: bool) -> None:
    assert starting(m) is expected


def test_keda_reads_whether_a_model_is_starting_from_the_responder() -> None:
    path = names.starting_path("ns", "granite")
    status, _, payload = _ask({("ns", "granite"): _starting_model()}, {}, "GET", path)
    assert (status, payload) == (200, {"starting": 1})
    status, _, payload = _ask({("ns", "granite"): _starting_model(ready=1)}, {}, "GET", path)
    assert (status, payload) == (200, {"starting": 0})
    # unknown: an error, so KEDA's trigger neither wakes nor idles the model on it
    status, _, payload = _ask({}, {}, "GET", path)
    assert status == 404 and "not known" in payload["error"]
    # a held request forwarded with that path is still a held request
    status, _, payload = _ask({("ns", "granite"): _starting_model()}, HEADERS, "GET", path)
    assert status == 503 and payload["error"]["type"] == "model_starting"
