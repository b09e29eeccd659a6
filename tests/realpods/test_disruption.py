"""What a platform team does to a served model, on the real node, under open-loop traffic.

One SpyreModel with the defaults a user gets (2 replicas, ``maxSurge: 0``, ``maxUnavailable:
1``, the default 30 s drain; small requests so three engine pods fit on the node's 2 CPUs).
The client is open-loop (``tests/bench/podclient.py rate``): a new request every 1/RATE
seconds, each on its own thread, so a slow or stopped pod cannot slow the client down and hide
failures the way a closed-loop client does. Each test brings the model to its own start state,
so any one runs alone with ``-k``.

1. the default rollout (a compile-affecting edit): the new artifact compiles while both old
   pods serve, then the Deployment replaces one pod at a time: 0 requests fail;
2. ``kubectl drain`` of the real node: the PodDisruptionBudget lets the first eviction through
   and refuses the second (the replacement cannot start on the cordoned node), 0 requests fail;
3. prefix caching on a real serving pod: the same long prompt twice to one pod, its
   ``vllm:prefix_cache_hits_total`` grows (read on the pod's own metrics port,
   serving.metricsPort; the serving port answers 404 on /metrics).

Each test starts where the one before it left the model (the edit of test 1), so the module
rolls the model once; run alone, a test compiles and rolls there first.
"""

from __future__ import annotations

import json
import subprocess
import time
from typing import Any

import pytest
from spyre_operator.decide import conditions as C
from spyre_operator.desired import names

from tests.bench.bench_realpods import PodClient
from tests.cluster.node import NODE_NAME
from tests.contract.realpods import RealEnv, failures, model_spec, real_env_fixture
from tests.realpods import support

pytestmark = [pytest.mark.realpods, pytest.mark.integration, pytest.mark.timeout(1800)]

env = real_env_fixture("disrupt")

MODEL = "disrupt"
#: Requests per second, open loop (each request max_tokens 4 on the tiny model).
RATE = 3.0
#: ~300 tokens of the tiny model's tokenizer: more than two of the 128-token prefill chunks,
#: which are what the plugin reuses from its prefix cache (a ~110-token prompt, within one
#: chunk, got no hit), with room for the output in maxModelLen 512 (prompts pad to chunks).
LONG_PROMPT = " ".join(f"word{i % 50}" for i in range(80))
#: serving.metricsPort of the module's model
METRICS_PORT = 9400


def _spec(env: RealEnv, **compile_: Any) -> dict[str, Any]:
    """The user's defaults: 2 replicas, the default rollout and drain (model_spec's test
    settings, maxSurge 1 and a 10 s drain, taken out again); maxModelLen 512 (the prefix-cache
    test's prompt needs more than two chunks) and the metrics on a port of their own."""
    spec = model_spec(env.image, replicas=2, compile={"maxModelLen": 512, **compile_})
    spec["serving"].pop("rollout", None)
    spec["serving"].pop("shutdownGracePeriodSeconds", None)
    spec["serving"]["metricsPort"] = METRICS_PORT
    return spec


#: The edit of the default rollout. The later tests start where it leaves the model (run in
#: order, no second rollout; run alone with ``-k``, they compile and roll there first).
EDITED = {"maxNumSeqs": 3}


def _live_pods(env: RealEnv) -> list[dict[str, Any]]:
    return [p for p in support.server_pods(env.cp, env.ns, MODEL)
            if not p["metadata"].get("deletionTimestamp")]


def _serving(env: RealEnv, replicas: int, key: str | None = None) -> dict[str, Any] | None:
    """The model, once it serves (Ready Serving, observed) ``replicas`` Ready pods of the
    current template (and ``key`` if given); else None."""
    m = env.kube.model(MODEL)
    st = m.get("status") or {}
    ready = next((c for c in st.get("conditions") or [] if c["type"] == C.READY), {})
    dep = env.kube.get("deployment", names.server_name(MODEL)) or {}
    ds = dep.get("status") or {}
    pods = _live_pods(env)
    ok = (st.get("observedGeneration") == m["metadata"]["generation"]
          and ready.get("status") == "True" and ready.get("reason") == C.SERVING
          and st.get("servingArtifactKey") == (st.get("artifact") or {}).get("key")
          and (key is None or st.get("servingArtifactKey") == key)
          and ds.get("observedGeneration") == dep["metadata"]["generation"]
          and ds.get("updatedReplicas") == replicas == ds.get("availableReplicas")
          and ds.get("replicas") == replicas
          and len(pods) == replicas and all(support.pod_ready(p) for p in pods))
    return m if ok else None


def _start_from(env: RealEnv, spec: dict[str, Any], what: str,
                timeout: float = 900) -> dict[str, Any]:
    support.apply_model(env.cp, env.ns, MODEL, spec)
    return support.wait_for(env.cp, env.ns, MODEL, f"{what}: serving its start spec",
                            lambda: _serving(env, spec["replicas"]), timeout)


def _observed_key(env: RealEnv, old_key: str) -> str | None:
    """The artifact key the model wants once it observed an edit that changed it."""
    m = env.kube.model(MODEL)
    st = m.get("status") or {}
    key = (st.get("artifact") or {}).get("key")
    if st.get("observedGeneration") == m["metadata"]["generation"] and key != old_key:
        return str(key)
    return None


def _report(what: str, results: list[dict[str, Any]]) -> str:
    bad = failures(results)
    kinds: dict[str, int] = {}
    for r in bad:
        k = str(r.get("status") or (r.get("error") or "?")[:60])
        kinds[k] = kinds.get(k, 0) + 1
    line = f"{what}: {len(results)} requests at {RATE}/s, {len(bad)} failed {kinds}"
    print(line)
    return f"{line}; first failures: {json.dumps(bad[:5])[:2000]}"


def _during(results: list[dict[str, Any]], t0: float, t1: float) -> int:
    return sum(1 for r in results if t0 <= r["t0"] <= t1)


# --------------------------------------------------------------------------- 1. default rollout


def test_the_default_rollout_under_open_loop_traffic_loses_no_request(env: RealEnv) -> None:
    old_key = _start_from(env, _spec(env), "default rollout")["status"]["servingArtifactKey"]
    url = support.service_url(env.cp, env.ns, MODEL)
    env.client.wait_routed(url)
    client = PodClient(env).rate(f"{url}/v1/completions", RATE)
    try:
        time.sleep(5)
        t_edit = time.time()
        support.apply_model(env.cp, env.ns, MODEL, _spec(env, **EDITED))
        new_key = support.wait_for(env.cp, env.ns, MODEL, "the edit observed",
                                   lambda: _observed_key(env, old_key), 120)
        support.wait_for(env.cp, env.ns, MODEL, "the default rollout to the new artifact",
                         lambda: _serving(env, 2, new_key), 900)
        t_done = time.time()
        time.sleep(5)
    finally:
        results = client.stop()
    explained = _report("default rollout (2 replicas, maxSurge 0)", results)
    assert _during(results, t_edit, t_done) >= RATE * 10, (
        f"too few requests during the rollout: {explained}")
    assert not failures(results), explained


# --------------------------------------------------------------------------- 2. kubectl drain


def _drain(env: RealEnv, timeout: int) -> subprocess.CompletedProcess[str]:
    sel = ",".join(f"{k}={v}" for k, v in names.server_selector(MODEL).items())
    return env.cp.kubectl("drain", NODE_NAME, f"--pod-selector={sel}", "--ignore-daemonsets",
                          "--delete-emptydir-data", f"--timeout={timeout}s", check=False,
                          timeout=timeout + 60)


def test_kubectl_drain_is_held_by_the_pdb_and_loses_no_request(env: RealEnv) -> None:
    _start_from(env, _spec(env, **EDITED), "drain")
    before = {p["metadata"]["name"] for p in _live_pods(env)}
    url = support.service_url(env.cp, env.ns, MODEL)
    env.client.wait_routed(url)
    client = PodClient(env).rate(f"{url}/v1/completions", RATE)
    try:
        time.sleep(5)
        # One replica goes at once; the other's eviction is refused by the PDB on every retry
        # (kubectl retries every 5 s) until the timeout: 20 s (four refusals) shows it held,
        # as 45 s and 90 s did.
        r = _drain(env, 20)
        out = r.stdout + r.stderr
        after = _live_pods(env)
        survivors = {p["metadata"]["name"] for p in after} & before
        time.sleep(5)
    finally:
        results = client.stop()
        env.cp.kubectl("uncordon", NODE_NAME, check=False)
    explained = _report("kubectl drain with 2 replicas", results)
    assert r.returncode != 0, f"drain evicted both replicas: {out[-2000:]}"
    assert "disruption budget" in out, f"drain did not stop at the PDB: {out[-2000:]}"
    assert len(survivors) == 1, (
        f"the PDB must keep exactly one of {sorted(before)}: left {sorted(survivors)}\n{out}")
    assert all(support.pod_ready(p) for p in after if p["metadata"]["name"] in survivors)
    assert not failures(results), explained
    # Uncordoned, the evicted replica's successor starts and the model serves 2 again.
    support.wait_for(env.cp, env.ns, MODEL, "2 replicas after uncordon",
                     lambda: _serving(env, 2), 900)


# --------------------------------------------------------------------------- 3. prefix cache


def _pod_post(env: RealEnv, ip: str, path: str, body: Any = None,
              port: int | None = None) -> support.HttpResult:
    port = port or env.kube.model(MODEL)["spec"].get("serving", {}).get("port", 8000)
    return support.http(env.cp, env.ns, f"http://{ip}:{port}{path}", body, timeout=120)


def test_a_repeated_prompt_hits_the_prefix_cache_on_a_serving_pod(env: RealEnv) -> None:
    """On one of the module's serving pods (maxModelLen 512: the prompt needs more than one
    chunk), where the drain test left them. Its metrics have a port of their own
    (serving.metricsPort): read there; the serving port answers 404 on /metrics."""
    _start_from(env, _spec(env, **EDITED), "prefix cache")
    ip = _live_pods(env)[0]["status"]["podIP"]
    body = {"model": support.SERVED_NAME, "prompt": LONG_PROMPT, "max_tokens": 4,
            "temperature": 0}

    public = _pod_post(env, ip, "/metrics")
    assert public.status == 404 and f"served on port {METRICS_PORT}" in public.text, (
        public.status, public.text[:500])

    def hits() -> float:
        res = _pod_post(env, ip, "/metrics", port=METRICS_PORT)
        assert res.status == 200, res.text[:500]
        return support.metric(support.parse_metrics(res.text), "vllm:prefix_cache_hits_total")

    first = _pod_post(env, ip, "/v1/completions", body)
    assert first.status == 200, first.text[:2000]
    h0 = hits()
    again = _pod_post(env, ip, "/v1/completions", body)
    assert again.status == 200, again.text[:2000]
    h1 = hits()
    prompt_tokens = first.json()["usage"]["prompt_tokens"]
    print(f"prefix cache: {h1 - h0:.0f} of {prompt_tokens} prompt tokens hit on the repeat")
    assert h1 - h0 > 0, f"no prefix-cache hit on the repeat ({h0} -> {h1} hits)"
