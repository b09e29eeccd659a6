"""A gated ``hf://`` model on the real node: the precompile Job downloads it with the token,
the serving pods hold no token, a token without access gives ``ModelAccessDenied``.

The hub is :class:`tests.engine.hub.LocalHub` serving the tiny model's files: it listens on the
host end of the node's link (``RealNode.host_ip``, an address of this machine that pods reach
through the node; nothing leaves the machine) and decides by the ``Authorization`` header as
huggingface.co does for a gated repo. ``model.downloadEnv`` points ``HF_ENDPOINT`` at it (plain
HTTP: the engine does not require TLS for a mirror); ``model.tokenSecret`` names the Secret. The
download is the engine image's own ``huggingface_hub``; the serving pods start with
``HF_HUB_OFFLINE=1`` from the cache the Job filled.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from typing import Any

import pytest
from spyre_operator.decide import conditions as C

from tests.cluster.controlplane import wait_until
from tests.contract.realpods import RealEnv, model_spec, real_env_fixture
from tests.engine.hub import LocalHub, Repo
from tests.realpods import support

pytestmark = [pytest.mark.realpods, pytest.mark.integration, pytest.mark.timeout(1200)]

env = real_env_fixture("gated")

#: The user who accepted the gated repos' terms, and one who did not (a valid token).
READER = f"hf_reader_{secrets.token_hex(8)}"
OUTSIDER = f"hf_outsider_{secrets.token_hex(8)}"


@pytest.fixture(scope="module")
def hub(env: RealEnv) -> Iterator[LocalHub]:
    with LocalHub(host=env.node.host_ip) as hub:
        hub.tokens |= {READER, OUTSIDER}
        tiny = support.tiny_model_dir()
        # One repo per test: a second model of the same repo and shape would find the first
        # one's artifact (the token is not part of the artifact key) and never download.
        for repo in ("org/tiny-gated", "org/tiny-gated-2"):
            hub.repos[repo] = Repo.from_dir(tiny, gated=True, readers={READER})
        yield hub


def token_secret(env: RealEnv, name: str, token: str) -> dict[str, str]:
    """Create the Secret ``name`` holding ``token``; returns the ``model.tokenSecret`` ref."""
    env.cp.kubectl("create", "secret", "generic", name, "-n", env.ns,
                   f"--from-literal=token={token}")  # fmt: skip
    return {"name": name, "key": "token"}


def gated_spec(env: RealEnv, hub: LocalHub, repo: str, secret: dict[str, str]) -> dict[str, Any]:
    return model_spec(env.image, model={
        "uri": f"hf://{repo}", "tokenSecret": secret,
        "downloadEnv": [{"name": "HF_ENDPOINT", "value": hub.url}],
    })  # fmt: skip


def artifact_outcome(env: RealEnv, name: str, timeout: float) -> dict[str, Any]:
    """``ArtifactReady`` once the precompile has an outcome (the artifact, or the engine's
    reason it failed): a download that wrongly succeeds fails the test then, not at the
    timeout."""
    ended = (C.MODEL_ACCESS_DENIED, C.MODEL_NOT_FOUND, C.PRECOMPILE_FAILED)

    def outcome() -> dict[str, Any] | None:
        c = env.kube.condition(name, "ArtifactReady")
        return c if c and (c["status"] == "True" or c["reason"] in ended) else None

    try:
        return wait_until(outcome, timeout, f"{name}'s precompile outcome",  # type: ignore[no-any-return]
                          interval=1)
    except TimeoutError as e:
        raise AssertionError(f"{e}\n{support.describe(env.cp, env.ns, name)}") from None


def test_the_job_downloads_with_the_token_and_the_pods_hold_none(
    env: RealEnv, hub: LocalHub
) -> None:
    t0 = time.monotonic()
    secret = token_secret(env, "hf-reader", READER)
    env.kube.apply_model("gated", gated_spec(env, hub, "org/tiny-gated", secret))
    model = support.wait_model_ready(
        env.cp, env.ns, "gated", timeout=900,
        fatal=(*support.FATAL_REASONS, C.MODEL_ACCESS_DENIED, C.MODEL_NOT_FOUND),
    )  # fmt: skip
    print(f"gated: apply -> Ready in {time.monotonic() - t0:.0f}s")

    # The files came from the hub, fetched with the reader's token (the real download code).
    repo = hub.repos["org/tiny-gated"]
    fetched = {path.rsplit("/", 1)[-1] for method, path, token in hub.requests
               if method == "GET" and "/org/tiny-gated/resolve/" in path and token == READER}
    assert set(repo.files) <= fetched, (sorted(fetched), hub.requests)
    assert model["status"]["artifact"]["modelRevision"] == repo.sha, model["status"]["artifact"]

    # The serving pods: no token, no reference to its Secret, nothing to download with.
    pods = support.server_pods(env.cp, env.ns, "gated")
    assert pods, support.describe(env.cp, env.ns, "gated")
    for pod in pods:
        text = json.dumps(pod["spec"])
        assert READER not in text and "hf-reader" not in text, text
        env_names = {e["name"] for c in pod["spec"]["containers"] for e in c.get("env") or []}
        assert "HF_TOKEN" not in env_names and "HF_ENDPOINT" not in env_names, env_names
        offline = [e for c in pod["spec"]["containers"] for e in c.get("env") or []
                   if e["name"] == "HF_HUB_OFFLINE"]  # fmt: skip
        assert offline and offline[0].get("value") == "1", offline

    # It serves the downloaded model (once kube-proxy routes the Service: a request right
    # after Ready was refused in one run).
    url = support.service_url(env.cp, env.ns, "gated")
    env.client.wait_routed(url)
    answer = env.client.complete(url)
    assert answer.get("status") == 200, answer


def test_a_token_without_access_gives_model_access_denied(env: RealEnv, hub: LocalHub) -> None:
    t0 = time.monotonic()
    secret = token_secret(env, "hf-outsider", OUTSIDER)
    env.kube.apply_model("denied", gated_spec(env, hub, "org/tiny-gated-2", secret))
    c = artifact_outcome(env, "denied", timeout=600)
    print(f"denied: apply -> ArtifactReady {c['reason']} in {time.monotonic() - t0:.0f}s")
    print(f"message: {c['message']}")
    assert c["status"] == "False" and c["reason"] == C.MODEL_ACCESS_DENIED, c
    # The hub's answer, as huggingface_hub reports it, is in the message.
    assert "403" in c["message"] and "gated" in c["message"], c
    assert "org/tiny-gated-2" in c["message"], c
    # The hub refused that token (it did reach the hub, with the Secret's token).
    assert any(token == OUTSIDER and "/org/tiny-gated-2" in path
               for _m, path, token in hub.requests), hub.requests  # fmt: skip
    degraded = env.kube.condition("denied", "Degraded")
    assert degraded and degraded["reason"] == C.MODEL_ACCESS_DENIED, degraded
    assert not support.server_pods(env.cp, env.ns, "denied")
