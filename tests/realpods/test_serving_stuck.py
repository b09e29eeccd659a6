"""A serving pod the real kubelet cannot start shows in status within 30 s, with the kubelet's
own reason and message (before, Ready=False RollingOut until the 40-minute progress deadline).

No engine image is needed: the precompile Job runs on a kwok node (kwok completes it), so the
artifact is "ready"; the serving pod goes to the real node, whose kubelet fails before any
engine code runs. A local image name no registry serves makes the pull fail on this machine
(nothing leaves it); the node's busybox image stands in where the kubelet must get as far as
the container's configuration (a Secret the serving env references).
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from spyre_operator.decide import conditions as C

from tests.cluster.ociimage import busybox_image
from tests.contract.realpods import HF_MODEL, MISSING_IMAGE
from tests.integration.conftest import Kube
from tests.realpods import support

pytestmark = [pytest.mark.realpods, pytest.mark.integration, pytest.mark.timeout(600)]



def spec(image: str, **override: Any) -> dict[str, Any]:
    """Serving on the real node; the precompile Job on a kwok node, where it completes."""
    s = support.tiny_model_spec(image, HF_MODEL, override=override)
    s["precompile"] = {"backoffLimit": 0, "nodeSelector": {"type": "kwok"}}
    return s


def test_a_serving_image_the_kubelet_cannot_pull(kube: Kube) -> None:
    kube.apply_model("nopull", spec(MISSING_IMAGE))
    kube.wait_condition("nopull", "ArtifactReady", "True", timeout=60)
    t0 = time.monotonic()
    c = kube.wait_condition("nopull", "Ready", "False", C.IMAGE_PULL_FAILED, 45)
    print(f"nopull: artifact ready -> Ready ImagePullFailed in {time.monotonic() - t0:.0f}s")
    assert MISSING_IMAGE in c["message"], c
    assert "ErrImagePull" in c["message"] or "ImagePullBackOff" in c["message"], c
    degraded = kube.condition("nopull", "Degraded")
    assert degraded and degraded["reason"] == C.IMAGE_PULL_FAILED, degraded


def test_a_secret_the_serving_env_references_is_missing(kube: Kube) -> None:
    env = [{"name": "EXTRA_TOKEN",
            "valueFrom": {"secretKeyRef": {"name": "serving-missing", "key": "token"}}}]
    kube.apply_model("nosecret", spec(busybox_image(), serving={"env": env}))
    kube.wait_condition("nosecret", "ArtifactReady", "True", timeout=60)
    t0 = time.monotonic()
    c = kube.wait_condition("nosecret", "Ready", "False", C.CONTAINER_CONFIG_ERROR, 45)
    print(f"nosecret: artifact ready -> ContainerConfigError in {time.monotonic() - t0:.0f}s")
    assert "CreateContainerConfigError" in c["message"], c
    # The kubelet's first message can be "failed to sync secret cache: timed out waiting for
    # the condition" (its watch of the namespace's secrets had not synced within the short wait
    # of pkg/kubelet/util/manager/watch_based_manager.go; seen on a loaded node); its next try
    # names the secret, and the condition follows the pod.
    c = kube.wait(lambda: (m := kube.condition("nosecret", "Ready")) and "serving-missing"
                  in m["message"] and m, 120, "Ready's message names the missing secret")
    assert c["status"] == "False" and c["reason"] == C.CONTAINER_CONFIG_ERROR, c
    assert "CreateContainerConfigError" in c["message"], c
    assert kube.condition("nosecret", "Degraded")["reason"] == C.CONTAINER_CONFIG_ERROR
