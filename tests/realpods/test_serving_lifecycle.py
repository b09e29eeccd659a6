"""A served model's life on the real node, with a client sending requests the whole time.

One SpyreModel (tiny model, CPU backend ``eager``, small requests so two engine pods fit on the
node's 2 CPUs) goes through the steps below. Each test first brings the model to its own
starting spec and waits until it serves it (:func:`_start_from`): run in order, that is where
the previous test left it (no wait); run alone with ``-k``, it compiles and rolls there first.

1. an engine upgrade the way an admin makes one, with ``maxSurge: 1``: the model leaves
   ``engine.image`` unset and the operator restarts with a new ``--default-engine-image`` (the
   chart's ``defaults.engineImage`` after ``helm upgrade``; a second tag of the engine image
   here). The new artifact compiles while the old pod serves (``Ready=True
   ServingPreviousArtifact``), the switch completes, no request fails;
2. the same with one replica and ``maxSurge: 0``: reported (failed requests, longest gap), not
   asserted: that roll has to stop the only pod;
3. deleting a serving pod mid-stream: the stream completes, or past the drain deadline ends
   with the engine's error event and ``[DONE]``, never a reset; the pod leaves the Service's
   endpoints before the engine stops accepting (no request through the Service is refused);
4. switching ``cache.volume.name`` (issue 10, failure 4): the pods keep serving from the old
   claim until the artifact exists on the new claim (``ServingPreviousArtifact`` meanwhile),
   then move, and a completion succeeds.

Requests go through the model's Service from a client pod (``tests/contract/client.py``).
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

import pytest
from spyre_engine import catalog
from spyre_operator.decide import conditions as C
from spyre_operator.desired import names

from tests.cluster.controlplane import wait_until
from tests.contract.realpods import (
    ChartOperator,
    RealEnv,
    Steady,
    claim_host_dir,
    connect_retries,
    describe_pods,
    failures,
    longest_gap,
    model_spec,
    real_env_fixture,
    server_pods,
    wait_ready,
)
from tests.realpods import support

pytestmark = [pytest.mark.realpods, pytest.mark.integration, pytest.mark.timeout(1500)]

env = real_env_fixture("life")

MODEL = "life"
def _spec(env: RealEnv, **override: Any) -> dict[str, Any]:
    """The module's spec: no engine.image, so the model follows the operator's default."""
    spec = model_spec(env.image, **override)
    del spec["engine"]["image"]
    return spec


def _default_engine_image(env: RealEnv, image: str) -> None:
    """``helm upgrade`` of the chart's defaults.engineImage (the operator's
    ``--default-engine-image``): its pod is replaced, the models follow."""
    assert isinstance(env.op, ChartOperator)
    env.op.upgrade({"defaults": {"engineImage": image}})


@pytest.fixture(scope="module")
def served(env: RealEnv) -> dict[str, Any]:
    """The module's model, Ready; with ``serving.allowFrom`` (its own namespace, where the
    client pod is): the chart-installed operator writes the NetworkPolicy with the chart's
    RBAC (the edits of the tests below drop allowFrom: it deletes it then)."""
    _default_engine_image(env, env.image)
    t0 = time.monotonic()
    env.kube.apply_model(MODEL, _spec(env, serving={"allowFrom": [
        {"namespaceSelector": {"kubernetes.io/metadata.name": env.ns}}]}))
    model = wait_ready(env.kube, MODEL)
    print(f"{MODEL}: apply -> Ready in {time.monotonic() - t0:.0f}s")
    np = env.kube.get("networkpolicy", MODEL)
    assert np and np["metadata"]["ownerReferences"][0]["name"] == MODEL, np
    return model


def _ready(model: dict[str, Any]) -> dict[str, Any] | None:
    return next((c for c in (model.get("status") or {}).get("conditions") or []
                 if c["type"] == "Ready"), None)


def _deployment(env: RealEnv) -> dict[str, Any]:
    dep = env.kube.get("deployment", names.server_name(MODEL))
    assert dep
    return dep  # type: ignore[no-any-return]


def _rolled_out(env: RealEnv, replicas: int) -> bool:
    dep = _deployment(env)
    st = dep.get("status") or {}
    pods = [p for p in server_pods(env.kube, MODEL) if not p["metadata"].get("deletionTimestamp")]
    return (
        st.get("observedGeneration") == dep["metadata"]["generation"]
        and st.get("updatedReplicas") == replicas
        and st.get("availableReplicas") == replicas
        and st.get("replicas") == replicas
        and len(pods) == replicas
        and all(support.pod_ready(p) for p in pods)
    )


def _start_from(env: RealEnv, spec: dict[str, Any], what: str,
                timeout: float = 900) -> dict[str, Any]:
    """The test's own starting state: the model at ``spec`` and serving it (observed, Ready
    ``Serving`` from its current artifact, rolled out to ``spec["replicas"]``)."""
    env.kube.apply_model(MODEL, spec)

    def settled() -> dict[str, Any] | None:
        m = env.kube.model(MODEL)
        st = m.get("status") or {}
        ready = next((c for c in st.get("conditions") or [] if c["type"] == C.READY), {})
        ok = (st.get("observedGeneration") == m["metadata"]["generation"]
              and ready.get("status") == "True" and ready.get("reason") == C.SERVING
              and st.get("servingArtifactKey") == (st.get("artifact") or {}).get("key")
              and _rolled_out(env, spec["replicas"]))
        return m if ok else None

    return support.wait_for(env.cp, env.ns, MODEL, f"{what}: the model serving its start spec",
                            settled, timeout)


def _switch(env: RealEnv, spec: dict[str, Any], what: str, timeout: float = 900,
            change: Callable[[], None] | None = None,
            old_key: str | None = None) -> dict[str, Any]:
    """Apply ``spec`` (a compile-affecting edit), or make ``change``, and follow the model
    until the Deployment serves the new artifact (another than ``old_key``, by default the
    one served now); returns what was seen on the way."""
    old = env.kube.model(MODEL)
    old_key = old_key or old["status"]["servingArtifactKey"]
    t0 = time.monotonic()
    if change is not None:
        change()
    else:
        env.kube.apply_model(MODEL, spec)
    seen: dict[str, Any] = {"reasons": [], "not_ready": [], "new_key": None}

    def switched() -> bool:
        m = env.kube.model(MODEL)
        st = m.get("status") or {}
        if st.get("observedGeneration") != m["metadata"]["generation"]:
            return False
        ready = _ready(m)
        if ready is None:
            return False
        if not seen["reasons"] or seen["reasons"][-1] != ready["reason"]:
            seen["reasons"].append(ready["reason"])
        if ready["status"] != "True":
            seen["not_ready"].append((round(time.monotonic() - t0, 1), ready["reason"]))
        key = st.get("artifact", {}).get("key")
        if key != old_key:
            seen["new_key"] = key
        return bool(key != old_key and st.get("servingArtifactKey") == key
                    and ready["reason"] == C.SERVING and _rolled_out(env, spec["replicas"]))

    try:
        wait_until(switched, timeout, f"{what}: the switch", interval=1)
    except TimeoutError as e:
        raise AssertionError(f"{e}; seen {seen}\n"
                             f"{support.describe(env.cp, env.ns, MODEL)}") from None
    seen["seconds"] = time.monotonic() - t0
    print(f"{what}: switched to {seen['new_key'][:12]} in {seen['seconds']:.0f}s; "
          f"Ready reasons {seen['reasons']}")
    return seen


# --------------------------------------------------------------------------- 1. maxSurge 1


def test_an_engine_upgrade_through_the_default_image_loses_no_request(
    env: RealEnv, served: dict[str, Any]
) -> None:
    _default_engine_image(env, env.image)  # run alone (-k) or after the others
    spec = _spec(env)
    _start_from(env, spec, "engine upgrade")
    # The upgrade: the same engine under a new reference (an artifact key input).
    upgraded = f"{env.image}-upgrade"
    env.node.ctr("images", "tag", "--force", env.image, upgraded)
    url = support.service_url(env.cp, env.ns, MODEL)
    env.client.wait_routed(url)
    steady = Steady(env.client, url)
    try:
        steady.wait_successes(3)
        seen = _switch(env, spec, "engine upgrade",
                       change=lambda: _default_engine_image(env, upgraded))
        n = len(steady.results())
        steady.wait_successes(sum(r.get("status") == 200 for r in steady.results()) + 3)
    finally:
        results = steady.stop()
    print(f"engine upgrade, maxSurge 1: {len(results)} requests, {len(failures(results))} "
          f"failed ({connect_retries(results)} connected at the second attempt), longest gap "
          f"{longest_gap(results):.1f}s")
    # The old pod served while the new artifact compiled (the model said so), and kept Ready.
    assert C.SERVING_PREVIOUS_ARTIFACT in seen["reasons"], seen
    assert not seen["not_ready"], seen
    assert n > 3, "the client sent no requests during the switch"
    assert not failures(results), _explain(failures(results), steady)
    status = env.kube.model(MODEL)["status"]
    assert status["effective"]["engineImage"] == upgraded, status["effective"]
    images = {c["image"] for p in server_pods(env.kube, MODEL)
              if not p["metadata"].get("deletionTimestamp") for c in p["spec"]["containers"]}
    assert images == {upgraded}, images


def _explain(bad: list[dict[str, Any]], steady: Steady) -> str:
    draining = [r for r in bad if "shutting down" in r.get("body", "")]
    why = (" (a request reached a terminating pod after its engine stopped accepting: the pod "
           "was still a Service endpoint in kube-proxy's rules)") if draining else ""
    return f"{len(bad)} requests failed{why}:\n{steady.explain(bad)}"


# --------------------------------------------------------------------------- 2. maxSurge 0


def test_what_one_replica_with_max_surge_0_costs(env: RealEnv, served: dict[str, Any]) -> None:
    """The roll must stop the only pod before its successor starts: the requests it fails
    are reported (the cost a user chooses with maxSurge 0), and asserted are what the
    operator owes then: the model said it was not serving (Ready not True) while nothing
    answered, and it serves the new artifact afterwards.

    The chart-installed operator's pod is deleted while the new artifact compiles: its
    successor adopts the running precompile Job (no second one) and finishes the switch."""
    _start_from(env, _spec(env), "maxSurge 0")
    url = support.service_url(env.cp, env.ns, MODEL)
    env.client.wait_routed(url)
    steady = Steady(env.client, url)
    try:
        steady.wait_successes(3)
        spec = _spec(env, compile={"maxNumSeqs": 4},
                     serving={"rollout": {"maxSurge": 0, "maxUnavailable": 1}})
        before = {j["metadata"]["name"] for j in support.jobs(env.cp, env.ns)}
        old_key = env.kube.model(MODEL)["status"]["servingArtifactKey"]
        env.kube.apply_model(MODEL, spec)
        early: list[str] = []  # Ready's reasons from the edit on (the restart comes next)

        def new_job_while_the_old_serves() -> list[dict[str, Any]] | None:
            ready = _ready(env.kube.model(MODEL))
            if ready and (not early or early[-1] != ready["reason"]):
                early.append(ready["reason"])
            new = [j for j in support.jobs(env.cp, env.ns) if j["metadata"]["name"] not in before]
            return new if new and C.SERVING_PREVIOUS_ARTIFACT in early else None

        [job] = wait_until(new_job_while_the_old_serves, 120,
                           "the new artifact's Job while the old one serves")
        assert isinstance(env.op, ChartOperator), env.op
        env.op.restart()
        seen = _switch(env, spec, "maxSurge 0", change=lambda: None, old_key=old_key)
        after = [j for j in support.jobs(env.cp, env.ns) if j["metadata"]["name"] not in before]
        assert [j["metadata"]["uid"] for j in after] == [job["metadata"]["uid"]], after
        # the served fixture's allowFrom is gone from the spec: its NetworkPolicy with it
        wait_until(lambda: env.kube.get("networkpolicy", MODEL) is None, 60,
                   "the NetworkPolicy deleted once allowFrom is gone")
        steady.wait_successes(sum(r.get("status") == 200 for r in steady.results()) + 3, 300)
    finally:
        results = steady.stop()
    bad = failures(results)
    kinds: dict[str, int] = {}
    for r in bad:
        k = str(r.get("status")) if r.get("status") else (r.get("error") or "?")[:60]
        kinds[k] = kinds.get(k, 0) + 1
    print(f"COST maxSurge 0, 1 replica: {len(results)} requests, {len(bad)} failed {kinds}, "
          f"longest gap without an answer {longest_gap(results):.1f}s, "
          f"Ready not True for {seen['not_ready'][:1]}..{seen['not_ready'][-1:]}")
    # the old artifact served while the new one compiled (seen before the restart: the
    # compile may end while the operator's pod is replaced)
    assert C.SERVING_PREVIOUS_ARTIFACT in early + seen["reasons"], (early, seen)
    if bad:  # no pod answered for a while: status must not have said Ready=True throughout
        assert seen["not_ready"], (f"{len(bad)} requests failed {kinds} while the model said "
                                   f"Ready=True throughout: {seen['reasons']}")


# --------------------------------------------------------------------------- 3. delete mid-stream


class EndpointWatch:
    """Polls the Service's EndpointSlices: when did ``ip`` stop being a ready endpoint."""

    def __init__(self, env: RealEnv, service: str, ip: str) -> None:
        self.env, self.service, self.ip = env, service, ip
        self.not_ready_at: float | None = None
        self.error: BaseException | None = None  # checked by the test
        self.stop = threading.Event()
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()

    def _ready(self) -> bool:
        slices = self.env.kube.items(
            "endpointslices", f"kubernetes.io/service-name={self.service}")
        for s in slices:
            for ep in s.get("endpoints") or []:
                if self.ip in ep.get("addresses", []):
                    return bool((ep.get("conditions") or {}).get("ready"))
        return False

    def _run(self) -> None:
        try:
            while not self.stop.is_set():
                t = time.time()
                if not self._ready():
                    self.not_ready_at = t
                    return
                time.sleep(0.1)
        except BaseException as e:  # noqa: BLE001 - reported to the test
            self.error = e


def _sigterm_at(log: str) -> float | None:
    """When the engine logged the signal (kubectl logs --timestamps), as epoch seconds."""
    for line in log.splitlines():
        if "Received SIGTERM" in line:
            stamp = line.split(" ", 1)[0]
            # RFC 3339 with nanoseconds: keep microseconds for fromisoformat.
            head, _, frac = stamp.partition(".")
            frac = frac.rstrip("Z")[:6]
            return datetime.fromisoformat(f"{head}.{frac}+00:00").timestamp()
    return None


def test_deleting_a_serving_pod_mid_stream(env: RealEnv, served: dict[str, Any]) -> None:
    _start_from(env, _spec(env, compile={"maxNumSeqs": 4}), "mid-stream")
    env.kube.apply_model(MODEL, _spec(env, compile={"maxNumSeqs": 4}, replicas=2))
    env.kube.wait(lambda: _rolled_out(env, 2), 600, "two serving pods Ready")
    pods = server_pods(env.kube, MODEL)
    victim = pods[0]
    name, ip = victim["metadata"]["name"], victim["status"]["podIP"]
    grace = int(victim["spec"]["terminationGracePeriodSeconds"])
    port = victim["spec"]["containers"][0]["ports"][0]["containerPort"]
    svc = names.server_name(MODEL)
    url = support.service_url(env.cp, env.ns, MODEL)

    logs = subprocess.Popen(
        [str(env.cp.bin_dir / "kubectl"), "--kubeconfig", str(env.cp.kubeconfig), "logs", "-f",
         "--timestamps", "-n", env.ns, name],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    steady = Steady(env.client, url, pause=0.05)
    try:
        steady.wait_successes(3)
        # A long stream straight to the victim (its pod IP), so it is the one in flight there.
        stream = env.client.stream(f"http://{ip}:{port}", max_tokens=240)
        assert stream.started.wait(120), "the stream never started"
        watch = EndpointWatch(env, svc, ip)
        t_delete = time.time()
        env.kube.kubectl("delete", "pod", name, "--wait=false")
        result = stream.result(grace + 60)
        env.kube.wait(lambda: not env.kube.get("pod", name), grace + 30, f"{name} gone")
        gone_after = time.time() - t_delete
        watch.stop.set()
        # requests after the removal, on the other pod
        steady.wait_successes(sum(r.get("status") == 200 for r in steady.results()) + 3)
    finally:
        results = steady.stop()
        logs.terminate()
    log = logs.communicate(timeout=30)[0]
    print(f"stream: {json.dumps(result)[:400]}; pod gone after {gone_after:.1f}s (grace {grace}s)")

    # The stream: completed, or cut at the drain deadline with the engine's error and [DONE].
    assert result["status"] == 200 and result["error"] is None, result  # never a reset
    assert result["done"], result
    if result["error_event"] is None:
        assert result.get("finish_reason") == "length" and result["events"] > 0, result
    else:
        assert "drain deadline" in result["error_event"]["message"], result
    assert gone_after < grace + 5, f"the pod took {gone_after:.1f}s (grace {grace}s)"

    # The pod left the Service's endpoints before the engine stopped accepting.
    sigterm = _sigterm_at(log)
    assert sigterm is not None, log[-2000:]
    assert watch.error is None, f"the endpoint watch failed: {watch.error!r}"
    assert watch.not_ready_at is not None
    print(f"endpoint not ready {watch.not_ready_at - t_delete:+.2f}s, engine SIGTERM "
          f"{sigterm - t_delete:+.2f}s after the delete")
    around = [r for r in results if r["t0"] >= t_delete - 1]
    assert around, "no request through the Service during the deletion"
    assert not failures(around), _explain(failures(around), steady)
    # (The order the control plane saw: the EndpointSlice marked it not ready, then the kubelet
    # sent SIGTERM. Without a preStop delay these are a fraction of a second apart, and
    # kube-proxy may reprogram only after the engine refuses; the requests above are the proof.)
    assert watch.not_ready_at <= sigterm, (watch.not_ready_at - t_delete, sigterm - t_delete)


# --------------------------------------------------------------------------- 4. cache claim


def _pod_claims(env: RealEnv) -> set[str]:
    out = set()
    for p in server_pods(env.kube, MODEL):
        if not support.pod_ready(p):
            continue
        for v in p["spec"]["volumes"]:
            if v.get("name") == "compile-cache":
                out.add(v["persistentVolumeClaim"]["claimName"])
    return out


def test_switching_the_cache_claim_serves_from_the_old_claim_until_the_new_has_the_artifact(
    env: RealEnv, served: dict[str, Any]
) -> None:
    before = _start_from(env, _spec(env, compile={"maxNumSeqs": 4}), "claim switch")
    old_claim = before["status"]["artifact"]["claim"]
    key = before["status"]["servingArtifactKey"]
    new_claim = "cache-b"
    assert old_claim != new_claim
    url = support.service_url(env.cp, env.ns, MODEL)
    env.client.wait_routed(url)
    steady = Steady(env.client, url)
    t0 = time.monotonic()
    reasons: list[str] = []
    early_moves: list[str] = []
    try:
        steady.wait_successes(3)
        env.kube.apply_model(MODEL, _spec(env, compile={"maxNumSeqs": 4},
                                          cache={"volume": {"name": new_claim}}))

        def moved() -> bool:
            m = env.kube.model(MODEL)
            st = m.get("status") or {}
            if st.get("observedGeneration") != m["metadata"]["generation"]:
                return False
            ready = _ready(m)
            if ready is None:
                return False
            if not reasons or reasons[-1] != f"{ready['status']}/{ready['reason']}":
                reasons.append(f"{ready['status']}/{ready['reason']}")
            claims = _pod_claims(env)
            if new_claim in claims:
                # A pod on the new claim: the artifact must be there already.
                art = claim_host_dir(env.cp, env.kube, new_claim) / "artifacts" / key
                if not catalog.catalog_path(art).exists():
                    early_moves.append(f"{time.monotonic() - t0:.0f}s: {claims}")
            art_st = st.get("artifact") or {}
            if (art_st.get("claim") == new_claim and art_st.get("phase") == "Ready"
                    and ready["reason"] == C.SERVING and claims == {new_claim}
                    and _rolled_out(env, 1)):
                return True
            return False

        try:
            wait_until(moved, 900, f"the move to {new_claim}", interval=1)
        except TimeoutError as e:
            raise AssertionError(f"{e}: {reasons}\n"
                                 f"{support.describe(env.cp, env.ns, MODEL)}") from None
        steady.wait_successes(sum(r.get("status") == 200 for r in steady.results()) + 3)
    finally:
        results = steady.stop()
    print(f"claim switch in {time.monotonic() - t0:.0f}s; Ready {reasons}; "
          f"{len(results)} requests, {len(failures(results))} failed, "
          f"{connect_retries(results)} connected at the second attempt")
    assert f"True/{C.SERVING_PREVIOUS_ARTIFACT}" in reasons, reasons
    assert all(r.startswith("True/") for r in reasons), reasons
    assert not early_moves, f"pods moved to {new_claim} before its artifact existed: {early_moves}"
    assert not failures(results), _explain(failures(results), steady)
    # After the move: it serves from the new claim.
    r = env.client.complete(url, max_tokens=8)
    assert r["status"] == 200, r
    dep = _deployment(env)
    vols = dep["spec"]["template"]["spec"]["volumes"]
    assert any(v.get("persistentVolumeClaim", {}).get("claimName") == new_claim for v in vols)
    assert describe_pods(env.kube)
