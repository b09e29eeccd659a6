"""A precompile pod the real kubelet cannot start shows in status within 30 s, with the
kubelet's own reason and message; fixing a field outside the artifact key replaces the stuck
Job. Before, both read "precompile Job ... is running" until the Job's deadline (7200 s).

No engine image is needed: the kubelet fails before any engine code runs. A local image name
no registry serves makes the pull fail on this machine (the node's network namespace has
nothing listening, nothing leaves it); the node's busybox image stands in where the kubelet
must get as far as the container's configuration (a Secret it references).
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
    return support.tiny_model_spec(image, HF_MODEL, override={
        "precompile": {"backoffLimit": 0}, **override})


def job_named_in_status(kube: Kube, name: str) -> dict[str, Any] | None:
    """The precompile Job the model's status names, or None while there is none: a stuck Job
    is replaced by deleting it and creating one of the same name, and between the two the
    status names a Job the API server does not have (CI of eca87c6 polled in that window)."""
    job_name = kube.model(name)["status"]["artifact"]["jobName"]
    return kube.get("job", job_name)  # type: ignore[no-any-return]


def precompile_job(kube: Kube, name: str) -> dict[str, Any]:
    job = job_named_in_status(kube, name)
    assert job is not None, f"no Job {kube.model(name)['status']['artifact']['jobName']}"
    return job


def test_an_image_the_kubelet_cannot_pull(kube: Kube) -> None:
    t0 = time.monotonic()
    kube.apply_model("nopull", spec(MISSING_IMAGE))
    c = kube.wait_condition("nopull", "ArtifactReady", "False", C.IMAGE_PULL_FAILED, 30)
    print(f"nopull: apply -> ArtifactReady ImagePullFailed in {time.monotonic() - t0:.0f}s")
    assert MISSING_IMAGE in c["message"], c
    assert "ErrImagePull" in c["message"] or "ImagePullBackOff" in c["message"], c
    degraded = kube.condition("nopull", "Degraded")
    assert degraded and degraded["reason"] == C.IMAGE_PULL_FAILED, degraded
    assert "is running" not in kube.model("nopull")["status"]["artifact"]["message"]


def test_a_missing_token_secret_and_its_fix(kube: Kube) -> None:
    missing = {"model": {"uri": HF_MODEL, "servedName": support.SERVED_NAME,
                         "tokenSecret": {"name": "hf-missing", "key": "token"}}}
    t0 = time.monotonic()
    kube.apply_model("nosecret", spec(busybox_image(), **missing))
    c = kube.wait_condition("nosecret", "ArtifactReady", "False", C.CONTAINER_CONFIG_ERROR, 30)
    print(f"nosecret: apply -> ContainerConfigError in {time.monotonic() - t0:.0f}s")
    assert "CreateContainerConfigError" in c["message"] and "hf-missing" in c["message"], c
    assert kube.condition("nosecret", "Degraded")["reason"] == C.CONTAINER_CONFIG_ERROR
    stuck = precompile_job(kube, "nosecret")
    kube.kubectl("create", "secret", "generic", "hf-token", "--from-literal=token=x")
    key = kube.model("nosecret")["status"]["artifact"]["key"]
    fixed = {"model": {**missing["model"], "tokenSecret": {"name": "hf-token", "key": "token"}}}
    t0 = time.monotonic()
    kube.apply_model("nosecret", spec(busybox_image(), **fixed))
    kube.wait(lambda: (job := job_named_in_status(kube, "nosecret")) is not None
              and job["metadata"]["uid"] != stuck["metadata"]["uid"], 30,
              "the stuck Job replaced")  # fmt: skip
    print(f"nosecret: fix -> Job replaced in {time.monotonic() - t0:.0f}s")
    assert kube.model("nosecret")["status"]["artifact"]["key"] == key  # outside the key
    kube.wait(lambda: kube.condition("nosecret", "ArtifactReady")["reason"]
              != C.CONTAINER_CONFIG_ERROR, 30, "the config error gone")
