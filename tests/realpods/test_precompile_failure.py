"""A precompile that really fails on the real node: the engine's reason reaches the status.

The model directory on the claim holds the tiny model's config and tokenizer but no weights,
so ``spyre-engine precompile`` in the operator's Job fails for real; the kubelet keeps the
engine's termination message and the operator puts its reason in ``status.artifact.message``
and ``Degraded``. The backend is ``inductor``, which really compiles (loads the model):
``eager`` compiles nothing and only records the shape, so its precompile succeeds without
weights (and the serving pods crash instead).
"""

from __future__ import annotations

import time

import pytest
from spyre_operator.decide import conditions as C
from spyre_operator.decide.summary import EngineFailure, parse_termination_message

from tests.contract.realpods import NO_WEIGHTS_PATH, RealEnv, model_spec, real_env_fixture
from tests.realpods import support

pytestmark = [pytest.mark.realpods, pytest.mark.integration, pytest.mark.timeout(900)]

env = real_env_fixture("pcfail")


def test_a_precompile_without_weights_fails_with_the_engines_reason(env: RealEnv) -> None:
    t0 = time.monotonic()
    spec = model_spec(env.image, path=NO_WEIGHTS_PATH, compile={"backend": "inductor"})
    env.kube.apply_model("broken", spec)
    degraded = env.kube.wait_condition("broken", "Degraded", "True", C.PRECOMPILE_FAILED, 600)
    print(f"broken: apply -> Degraded PrecompileFailed in {time.monotonic() - t0:.0f}s")

    model = env.kube.model("broken")
    art = model["status"]["artifact"]
    assert art["phase"] == "Failed", art
    job_pods = env.kube.items("pods", f"job-name={art['jobName']}")
    assert len(job_pods) == 1, support.describe(env.cp, env.ns, "broken")
    cs = job_pods[0]["status"]["containerStatuses"][0]
    term = cs["state"]["terminated"]
    assert term["exitCode"] != 0
    failure = parse_termination_message(term.get("message"))
    # The engine wrote its own reason (not a log tail the kubelet fell back to).
    assert isinstance(failure, EngineFailure), term.get("message")
    print(f"engine: {failure.reason}: {failure.message[:300]}")
    assert failure.reason and failure.message
    assert failure.message[:200] in art["message"], (failure, art)
    assert failure.reason in degraded["message"] and failure.message[:200] in degraded["message"]
    ready = env.kube.condition("broken", "Ready")
    assert ready and ready["status"] == "False" and ready["reason"] == C.PRECOMPILE_FAILED
    # No serving pod was ever created for an artifact that does not exist.
    assert not support.server_pods(env.cp, env.ns, "broken")

