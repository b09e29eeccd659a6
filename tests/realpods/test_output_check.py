"""No artifact takes traffic before it answers right (issue 30), on the real node.

An inductor precompile records the artifact's reference answers (greedy token ids and logprobs
of a small prompt set, ``spyre_reference_answers.json`` under the manifest) on a second vLLM on
``eager`` after its compile: the reference is not the compiler under check. Each serving pod
answers them on inductor, with the plugin's GoldenTokenInjector loaded, before it turns Ready:
the first artifact's inductor answers pass against eager's and it is promoted.

Here the model's weights change on its claim after the second artifact's precompile loaded them
(the same model name over changed weights, as a cache built from other inputs would be). The
second artifact is ``eager`` (issue 44, 6: every backend has a reference, eager included; its
precompile starts one vLLM, eager's, for the reference alone): its pod answers unlike that
reference, stops with ``OutputMismatch``, the artifact is refused and the Deployment stays on
(or goes back to) the first one, which never stopped serving: no request fails. The first
artifact's pods checked their own answers and passed.

Once the first artifact has served every replica, the operator names it in the model's
``<model>-output-check`` ConfigMap (a pod that starts on it again skips the check, issue 30's
"cheap when nothing changed": the engine's side in tests/engine/test_precompile.py, the
operator's in tests/unit/test_output_verified.py and the kwok modules; a restart of the main
pod here cost a vLLM start on the critical path, issue 43).

The model runs a canary (``spec.serving.canary``): the second artifact's first pod is a canary
pod, so the main Deployment never moves. The second artifact is then checked again (the retry
annotation, nothing compiles) with the weights its references were recorded on back in place,
its engine now answering every request with a 500 (``SPYRE_ENGINE_FAULT_ERROR_RATIO``, the
engine's fault flag: the proxy's, which the check, asked of vLLM directly, never meets): it
passes its check and takes its share of the traffic as a canary: it breaks the bounds, stops
with ``CanaryFailed``, and the model keeps the first artifact. The only failed requests are
the canary's injected 500s, none once it is gone. Before its traffic starts (issue 44), the
operator has read the canary pod's own count (0 judged). (One eager compile for both
refusals: a third artifact cost a precompile's vLLM start and its reference run, issue 43. The
main Deployment at 0 available promoting nothing: tests/unit/test_canary.py.)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from typing import Any

import pytest
from spyre_engine import answers, manifest
from spyre_operator.decide import conditions as C
from spyre_operator.decide.observed import RETRY_ANNOTATION
from spyre_operator.desired import names

from tests.contract.realpods import (
    MODEL_CLAIM,
    RealEnv,
    Steady,
    artifact_host_dir,
    assert_inductor_served_without_compiling,
    claim_host_dir,
    failures,
    model_spec,
    real_env_fixture,
)
from tests.realpods import support

pytestmark = [pytest.mark.realpods, pytest.mark.integration, pytest.mark.timeout(1500)]

env = real_env_fixture("outcheck")

MODEL = "checked"
#: The model's own directory on the model claim (its weights are swapped in this test only).
PATH = "swappable"
WEIGHTS = "model.safetensors"
#: A long window: the canary must fail on its bounds, never pass by running out the clock.
#: The second artifact's compile: another shape on eager (a new key).
SECOND = {"backend": "eager", "maxNumSeqs": 3}
CANARY = {"replicas": 1, "durationSeconds": 1800, "minRequests": 3, "maxErrorRatio": 0.2}
FAULT = {"name": "SPYRE_ENGINE_FAULT_ERROR_RATIO", "value": "1"}
#: The tiny model answers near-uniformly (528 tokens, each ~0.2%): no comparison of
#: probabilities tells one such model from another. Its final norm scaled by 30 makes it as
#: sure of its tokens as a trained model is (top-1 ~1.0), written in place (before any
#: compile); the perturbed copy (noise on every weight) is then a different model of the same
#: shape, just as sure of other tokens.
_SHARPEN_AND_PERTURB = r"""
import os, sys, torch
from safetensors.torch import load_file, save_file
src, dest = sys.argv[1], sys.argv[2]
t = load_file(src)
t["model.norm.weight"] = t["model.norm.weight"] * 30
save_file(t, src + ".tmp")
os.replace(src + ".tmp", src)
torch.manual_seed(7)
save_file({k: (v + torch.randn_like(v) * (v.float().std() + 0.05)).to(v.dtype)
           if v.is_floating_point() else v for k, v in t.items()}, dest)
"""


def _spec(env: RealEnv, serving: dict[str, Any] | None = None, **compile_: Any) -> dict[str, Any]:
    return model_spec(env.image, path=PATH, compile={"backend": "inductor", **compile_},
                      serving={"canary": CANARY, "outputCheck": "Enforce",
                               **(serving or {})})  # fmt: skip


def _canary_gone(env: RealEnv) -> bool:
    return env.kube.get("deployment", names.canary_name(MODEL)) is None and not [
        p for p in support.server_pods(env.cp, env.ns, MODEL)
        if p["metadata"]["labels"].get(names.CANARY_LABEL)]  # fmt: skip


def _job_log(env: RealEnv, job: str) -> str:
    r = env.cp.kubectl("logs", "-n", env.ns, f"job/{job}", check=False)
    return r.stdout if r.returncode == 0 else ""


def _served_key(env: RealEnv) -> str | None:
    dep = env.kube.get("deployment", names.server_name(MODEL))
    return (dep or {}).get("metadata", {}).get("annotations", {}).get(names.ARTIFACT_KEY_ANNOTATION)


#: Issue 44: the output check's key, spelled with a JSON escape, and an expectation the plugin's
#: injector cannot use (a token id no vocabulary has). Before engine/spyre_engine/guard.py a
#: byte match missed it, vLLM's worker raised on it and the engine core died (500, then 502
#: until the container restarted).
ESCAPED_KEY = "golden\\u005ftoken_injector"
BAD_EXPECTATION = json.dumps({"expected_token_ids": [2**40], "expected_logprobs": [0.0],
                              "error_threshold": 0.1})


def _clients_cannot_reach_the_injector(env: RealEnv, pod: dict[str, Any]) -> None:
    """On a pod whose engine loaded the injector: the escaped key, three times through the
    Service, is refused each time; a control route is not found; a prompt naming the key and
    the next request are answered; the container never restarted."""
    url = support.service_url(env.cp, env.ns, MODEL)
    attack = json.dumps({"model": support.SERVED_NAME, "prompt": "hi", "max_tokens": 2,
                         "vllm_xargs": {"@key@": BAD_EXPECTATION}}
                        ).replace('"@key@"', f'"{ESCAPED_KEY}"')
    assert ESCAPED_KEY in attack and json.loads(attack)["vllm_xargs"] == {
        "golden_token_injector": BAD_EXPECTATION}  # what vLLM would read
    for _ in range(3):
        res = support.http(env.cp, env.ns, url + "/v1/completions", raw=attack)
        assert res.status == 400 and "reserved" in res.text, (res.status, res.text[:500])
    res = support.http(env.cp, env.ns, url + "/reset_prefix_cache", raw="{}")
    assert res.status == 404, (res.status, res.text[:500])
    out = support.completion(env.cp, env.ns, MODEL, "what is golden_token_injector?",
                             max_tokens=2)
    assert out["choices"][0]["text"], out
    now = env.cp.kubectl_json("get", "pod", "-n", env.ns, pod["metadata"]["name"])
    assert [c["restartCount"] for c in now["status"]["containerStatuses"]] == [0], now["status"]


def test_an_artifact_whose_answers_changed_is_refused_while_the_previous_one_serves(
    env: RealEnv,
) -> None:
    support.create_model_pvc(env.cp, env.ns, path=PATH)
    model_dir = claim_host_dir(env.cp, env.kube, MODEL_CLAIM) / PATH
    perturbed = model_dir.parent / f".{PATH}-perturbed.safetensors"
    original = model_dir.parent / f".{PATH}-original.safetensors"
    subprocess.run([sys.executable, "-c", _SHARPEN_AND_PERTURB, str(model_dir / WEIGHTS),
                    str(perturbed)],
                   check=True, capture_output=True, text=True, timeout=300)  # fmt: skip
    for f in (perturbed, model_dir / WEIGHTS):
        os.chmod(f, 0o644)

    t0 = time.monotonic()
    env.kube.apply_model(MODEL, _spec(env))
    first = support.wait_model_ready(env.cp, env.ns, MODEL, timeout=900)
    key1 = first["status"]["artifact"]["key"]
    print(f"artifact 1 compiled, checked and Ready in {time.monotonic() - t0:.0f}s")
    # inductor's answers checked against eager's, not against its own
    refs = first["status"]["artifact"].get("references") or {}
    assert refs.get("source") == "eager", first["status"]["artifact"]
    # What the compile left (until issue 43 an inductor compile of the local engine tests):
    # graphs and code (> 1 MB, the compile's time read back into status), eager's answers to
    # every reference prompt (a long one and a repeated prefix included), the manifest
    # covering both.
    art1 = artifact_host_dir(env.cp, env.kube, first)
    recorded, ref_doc = answers.read(art1) or ([], {})
    assert len(recorded) == len(answers.DEFAULT_PROMPTS) + 2, ref_doc
    assert ref_doc["recordedWith"]["backend"] == "eager", ref_doc
    listed = {f["path"] for f in manifest.verify(art1)["files"]}
    assert answers.REFERENCE_FILENAME in listed and any(f.startswith("inductor/") for f in listed)
    assert first["status"]["artifact"]["sizeBytes"] > 1_000_000, first["status"]["artifact"]
    assert first["status"]["artifact"]["compileSeconds"] > 1, first["status"]["artifact"]
    [pod] = support.server_pods(env.cp, env.ns, MODEL)
    log = env.cp.kubectl("logs", "-n", env.ns, pod["metadata"]["name"]).stdout
    assert "Output check passed" in log and "answered as the reference" in log, log[-3000:]
    # Inductor really compiled into the claim, and the pod (its check and a request included)
    # compiled nothing more: the contract tests' inductor case until issue 43.
    _clients_cannot_reach_the_injector(env, pod)
    assert_inductor_served_without_compiling(env.cp, env.ns, pod,
                                             artifact_host_dir(env.cp, env.kube, first))
    # Artifact 1 passed on every replica: the operator names it, and a pod that starts on it
    # again on the same files asks nothing (the main pod's replacement below).
    env.kube.wait(lambda: names.short_key(key1) in ((env.kube.get(
        "configmap", names.verified_name(MODEL)) or {}).get("data") or {}), 120,
        "artifact 1 named in the model's output-check ConfigMap")  # fmt: skip

    url = support.service_url(env.cp, env.ns, MODEL)
    steady = Steady(env.client, url)
    try:
        steady.wait_successes(3)
        # The edit: a new shape on eager, a new artifact. Its precompile loads the weights once
        # (eager's vLLM, for the reference), then they change on the claim (a new file renamed
        # over the old: the loaded one stays intact).
        env.kube.apply_model(MODEL, _spec(env, **SECOND))
        job = env.kube.wait(
            lambda: (a := env.kube.model(MODEL)["status"].get("artifact") or {}).get("key")
            != key1 and a.get("jobName"), 120, "the second artifact's Job")  # fmt: skip
        # the plugin's worker logs it once the model is loaded (spyre_worker.load_model)
        env.kube.wait(lambda: "load model took" in _job_log(env, job), 600,
                      "the second precompile's reference run loaded the weights")  # fmt: skip
        shutil.copy2(model_dir / WEIGHTS, original)  # the same bytes, size and mtime
        os.replace(perturbed, model_dir / WEIGHTS)
        t1 = time.monotonic()

        def refused() -> dict[str, Any] | None:
            m = env.kube.model(MODEL)
            art = m["status"].get("artifact") or {}
            return m if art.get("reason") == C.OUTPUT_MISMATCH else None

        m = env.kube.wait(refused, 900, "the second artifact refused for OutputMismatch")
        print(f"artifact 2 refused {time.monotonic() - t1:.0f}s after the weights changed")
        art = m["status"]["artifact"]
        assert art["phase"] == "Failed" and art["key"] != key1, art
        key2 = art["key"]
        assert "answers unlike the artifact's reference" in art["message"], art
        assert "position" in art["message"], art
        ready = env.kube.wait(lambda: (c := support.condition(env.kube.model(MODEL), "Ready"))
                              and c["reason"] == C.SERVING_PREVIOUS_ARTIFACT and c, 120,
                              "Ready says the previous artifact serves")  # fmt: skip
        assert ready["status"] == "True" and "output check" in ready["message"], ready
        degraded = support.condition(env.kube.model(MODEL), "Degraded")
        assert degraded and degraded["reason"] == C.OUTPUT_MISMATCH, degraded
        # The Deployment is back on the first artifact, and stays there.
        env.kube.wait(lambda: _served_key(env) == key1, 120, "the Deployment serves artifact 1")
        env.kube.wait(lambda: all(p["metadata"]["labels"].get(names.ARTIFACT_LABEL)
                                  == names.short_key(key1)
                                  for p in support.server_pods(env.cp, env.ns, MODEL)), 300,
                      "only artifact 1's pods are left")  # fmt: skip
        steady.wait_successes(len(steady.results()) + 3)
        env.kube.wait(lambda: _canary_gone(env), 120, "the refused artifact's canary removed")
        assert not failures(steady.results()), failures(steady.results())[:5]
        quiet = steady.stop()  # no traffic while artifact 2's canary starts again
        # The files artifact 2's references were recorded on back in place.
        os.replace(original, model_dir / WEIGHTS)

        # Artifact 2 again, on the weights of its references, as a canary that answers 500:
        # it passes its check, fails on its bounds, and the model keeps artifact 1.
        env.kube.apply_model(MODEL, _spec(env, {"env": [FAULT]}, **SECOND))
        env.cp.kubectl("annotate", "spyremodel", MODEL, "-n", env.ns,
                       f"{RETRY_ANNOTATION}=weights-restored", "--overwrite")  # fmt: skip
        env.kube.wait(lambda: (support.condition(env.kube.model(MODEL), "Progressing") or {})
                      .get("reason") == C.CANARY_RUNNING, 600,
                      "artifact 2's canary, checked again")  # fmt: skip
        # Issue 44: the operator reads the canary pod's own count (its /health/canary) ...
        counted = env.kube.wait(lambda: (c := env.kube.model(MODEL)["status"].get("canary")
                                         or {}).get("judgedRequests") == 0 and c, 120,
                                "the canary pod's count of judged requests read")  # fmt: skip
        assert counted["minRequests"] == CANARY["minRequests"], counted
        assert _served_key(env) == key1 and counted["phase"] == "Running", counted
        steady = Steady(env.client, url)

        def canary_failed() -> dict[str, Any] | None:
            m = env.kube.model(MODEL)
            art = m["status"].get("artifact") or {}
            return m if art.get("reason") == C.CANARY_FAILED else None

        m = env.kube.wait(canary_failed, 600, "the second artifact refused for CanaryFailed")
        art, canary = m["status"]["artifact"], m["status"]["canary"]
        assert art["phase"] == "Failed" and "failed with a server error" in art["message"], art
        assert art["key"] == key2, (art, key2)
        assert canary["phase"] == "Failed" and canary["artifactKey"] == art["key"], canary
        assert _served_key(env) == key1, "the main Deployment never left artifact 1"
        degraded = support.condition(m, "Degraded")
        assert degraded and degraded["reason"] == C.CANARY_FAILED, degraded
        env.kube.wait(lambda: _canary_gone(env), 180, "the failed canary removed")
        gone_at = time.time()
        steady.wait_successes(sum(r.get("status") == 200 for r in steady.results()) + 3)
    except BaseException:
        shutil.rmtree(model_dir, ignore_errors=True)
        original.unlink(missing_ok=True)
        raise
    finally:
        results = quiet + steady.stop() if "quiet" in locals() else steady.stop()
    try:  # the model's files stay for artifact 2's pods (its canary, run again)
        bad = failures(results)
        print(f"steady traffic: {len(results)} requests, {len(bad)} failed (the canary's 500s)")
        assert bad, "the faulty canary took no share of the traffic"
        assert all(r["status"] == 500 and "injected fault" in r.get("body", "")
                   for r in bad), bad[:5]  # fmt: skip
        assert all(r["t1"] <= gone_at for r in bad), "a request failed after the canary was gone"
        assert _served_key(env) == key1
        assert env.kube.model(MODEL)["status"]["lastGoodArtifactKey"] == key1
        _fixed_canary_waits_for_traffic_then_passes_against_the_baseline(env, key2, key1)
    finally:
        shutil.rmtree(model_dir, ignore_errors=True)
        original.unlink(missing_ok=True)


def _fixed_canary_waits_for_traffic_then_passes_against_the_baseline(
    env: RealEnv, key2: str, key1: str
) -> None:
    """Issue 44, 2 and 5: artifact 2 without its fault, its canary run again by the retry
    annotation (nothing compiles). With no traffic its window ends unjudged and nothing
    is promoted (CanaryAwaitingTraffic); once requests come it passes, compared with artifact
    1's pod over its window (both pods' figures read from their engines: vLLM's own TTFT and
    TPOT), and the Deployment rolls out to it. The ratio is wide: eager against inductor on a
    shared CPU is no latency benchmark; what is checked is that both sides were read."""
    canary = {**CANARY, "durationSeconds": 15, "maxLatencyRatio": 50}
    env.kube.apply_model(MODEL, _spec(env, {"canary": canary}, **SECOND))
    env.cp.kubectl("annotate", "spyremodel", MODEL, "-n", env.ns,
                   f"{RETRY_ANNOTATION}=fixed", "--overwrite")  # fmt: skip
    waiting = env.kube.wait(lambda: (c := support.condition(env.kube.model(MODEL), "Progressing"))
                            and c["reason"] == C.CANARY_AWAITING_TRAFFIC and c, 600,
                            "the idle canary waiting for traffic")  # fmt: skip
    assert "judged too few requests" in waiting["message"], waiting
    assert _served_key(env) == key1, "an idle canary promoted nothing"
    url = support.service_url(env.cp, env.ns, MODEL)
    steady = Steady(env.client, url)
    try:
        m = env.kube.wait(lambda: (m := env.kube.model(MODEL))["status"].get("canary", {}).get(
            "phase") == "Passed" and m, 300, "the canary passed once requests came")  # fmt: skip
        st = m["status"]["canary"]
        assert st["reason"] == C.WINDOW_PASSED and st["artifactKey"] == key2, st
        sides = st["comparison"]
        print(f"canary against the baseline: {sides['message']}")
        assert sides["canary"]["pods"] == 1 and sides["canary"]["requests"] >= 3, sides
        assert sides["canary"].get("ttftSeconds") and sides["canary"].get("tpotSeconds"), sides
        assert sides["baseline"]["pods"] == 1, sides
        assert "within 50x of the baseline" in sides["message"] or "not compared yet: the "\
            "baseline served" in sides["message"], sides
        # the switch is written with the pass (its rollout, and the canary's removal once it is
        # done, are the rollout tests' subject: not waited for here)
        env.kube.wait(lambda: _served_key(env) == key2, 60, "the Deployment on artifact 2")
    finally:
        steady.stop()
