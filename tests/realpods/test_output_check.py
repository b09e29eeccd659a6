"""No artifact takes traffic before it answers right (issue 30), on the real node.

An inductor precompile records the artifact's reference answers (greedy token ids and logprobs
of a small prompt set, ``spyre_reference_answers.json`` under the manifest); each serving pod
answers them with the plugin's GoldenTokenInjector loaded before it turns Ready.

Here the model's weights change on its claim after the second artifact's precompile loaded them
(the same model name over changed weights, as a cache built from other inputs would be): the new
artifact's pod answers unlike its reference, stops with ``OutputMismatch``, the artifact is
refused and the Deployment goes back to the first one, which never stopped serving: no request
fails. The first artifact's pods checked their own answers and passed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from typing import Any

import pytest
from spyre_operator import conditions as C
from spyre_operator.desired import names

from tests.contract.realpods import (
    MODEL_CLAIM,
    RealEnv,
    Steady,
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
#: Adds noise to every weight of a safetensors file (a different model of the same shape).
_PERTURB = r"""
import sys, torch
from safetensors.torch import load_file, save_file
src, dest = sys.argv[1], sys.argv[2]
torch.manual_seed(7)
t = load_file(src)
save_file({k: (v + torch.randn_like(v) * (v.float().std() + 0.05)).to(v.dtype)
           if v.is_floating_point() else v for k, v in t.items()}, dest)
"""


def _spec(env: RealEnv, **compile_: Any) -> dict[str, Any]:
    return model_spec(env.image, path=PATH, compile={"backend": "inductor", **compile_})


def _job_log(env: RealEnv, job: str) -> str:
    r = env.cp.kubectl("logs", "-n", env.ns, f"job/{job}", check=False)
    return r.stdout if r.returncode == 0 else ""


def _served_key(env: RealEnv) -> str | None:
    dep = env.kube.get("deployment", names.server_name(MODEL))
    return (dep or {}).get("metadata", {}).get("annotations", {}).get(names.ARTIFACT_KEY_ANNOTATION)


def test_an_artifact_whose_answers_changed_is_refused_while_the_previous_one_serves(
    env: RealEnv,
) -> None:
    support.create_model_pvc(env.cp, env.ns, path=PATH)
    model_dir = claim_host_dir(env.cp, env.kube, MODEL_CLAIM) / PATH
    perturbed = model_dir.parent / f".{PATH}-perturbed.safetensors"
    subprocess.run([sys.executable, "-c", _PERTURB, str(model_dir / WEIGHTS), str(perturbed)],
                   check=True, capture_output=True, text=True, timeout=300)  # fmt: skip
    os.chmod(perturbed, 0o644)

    t0 = time.monotonic()
    env.kube.apply_model(MODEL, _spec(env))
    first = support.wait_model_ready(env.cp, env.ns, MODEL, timeout=900)
    key1 = first["status"]["artifact"]["key"]
    print(f"artifact 1 compiled, checked and Ready in {time.monotonic() - t0:.0f}s")
    [pod] = support.server_pods(env.cp, env.ns, MODEL)
    log = env.cp.kubectl("logs", "-n", env.ns, pod["metadata"]["name"]).stdout
    assert "Output check passed" in log and "answered as the reference" in log, log[-3000:]

    url = support.service_url(env.cp, env.ns, MODEL)
    steady = Steady(env.client, url)
    try:
        steady.wait_successes(3)
        # The edit: a new shape, a new artifact. Its precompile loads the weights, then they
        # change on the claim (a new file renamed over the old: the loaded one stays intact).
        env.kube.apply_model(MODEL, _spec(env, maxNumSeqs=3))
        job = env.kube.wait(
            lambda: (a := env.kube.model(MODEL)["status"].get("artifact") or {}).get("key")
            != key1 and a.get("jobName"), 120, "the second artifact's Job")  # fmt: skip
        # the plugin's worker logs it once the model is loaded (spyre_worker.load_model)
        env.kube.wait(lambda: "load model took" in _job_log(env, job), 600,
                      "the second precompile loaded the weights")  # fmt: skip
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
    finally:
        results = steady.stop()
        shutil.rmtree(model_dir, ignore_errors=True)
    print(f"steady traffic: {len(results)} requests, {len(failures(results))} failed")
    assert not failures(results), failures(results)[:5]
    assert _served_key(env) == key1
    assert env.kube.model(MODEL)["status"]["lastGoodArtifactKey"] == key1
