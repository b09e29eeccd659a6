"""A test that waits on a model gives up saying what the namespace's pods were doing (issue 43:
on a slow machine, "timed out" alone does not tell a slow start from a stuck pod)."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from tests.integration.conftest import Kube, pods_summary

PULLING = {
    "metadata": {"name": "m-abc"},
    "spec": {"nodeName": "spyre-real-0"},
    "status": {
        "phase": "Pending",
        "conditions": [{"type": "Ready", "status": "False", "reason": "ContainersNotReady",
                        "message": "containers with unready status: [engine]"}],
        "containerStatuses": [{"name": "engine", "restartCount": 0, "state": {"waiting": {
            "reason": "ImagePullBackOff", "message": "Back-off pulling image \"x\""}}}],
    },
}
UNSCHEDULED = {
    "metadata": {"name": "m-def", "deletionTimestamp": "2026-12-06T00:00:00Z"},
    "spec": {},
    "status": {"phase": "Pending", "conditions": [{
        "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
        "message": "0/3 nodes are available: 1 node(s) were unschedulable."}]},
}
CRASHED = {
    "metadata": {"name": "m-ghi"},
    "spec": {"nodeName": "spyre-real-0"},
    "status": {"phase": "Running", "containerStatuses": [{
        "name": "engine", "restartCount": 3,
        "state": {"terminated": {"reason": "Error", "exitCode": 1}}}]},
}


def test_the_summary_says_what_each_pod_is_doing() -> None:
    text = pods_summary("ns", [PULLING, UNSCHEDULED, CRASHED])
    lines = text.splitlines()
    assert lines[0] == "pods in ns when the wait gave up (3):"
    assert "m-abc: Pending node=spyre-real-0" in lines[1]
    assert "engine waiting ImagePullBackOff Back-off pulling image" in lines[1]
    assert "Ready=ContainersNotReady" in lines[1]
    assert "m-def: Pending node=- terminating PodScheduled=Unschedulable: 0/3 nodes" in lines[2]
    assert "engine terminated Error 1 restarts=3" in lines[3]
    many = pods_summary("ns", [CRASHED] * 5, limit=2)
    assert many.splitlines()[-1] == "  ... and 3 more"


class _FakeCP:
    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods = pods

    def kubectl(self, *args: str, **_: Any) -> subprocess.CompletedProcess[str]:
        if args[:2] == ("get", "pods"):
            return subprocess.CompletedProcess(list(args), 0, json.dumps({"items": self.pods}), "")
        return subprocess.CompletedProcess(list(args), 1, "", "NotFound")


def test_a_wait_that_gives_up_names_the_pods() -> None:
    kube = Kube(_FakeCP([PULLING]), "ns")  # type: ignore[arg-type]
    with pytest.raises(TimeoutError) as e:
        kube.wait(lambda: False, timeout=0.2, desc="the model Ready")
    assert "the model Ready" in str(e.value) and "ImagePullBackOff" in str(e.value)
    assert kube.wait(lambda: "yes", timeout=1) == "yes"
