"""Is this pod stuck? One answer for serving and precompile pods (pure, on compact pods).

The records are the compact ones ``controller.compact_pod`` makes: ``waiting`` (the kubelet's
reason for a container that is not running), ``waitingMessage``, ``unschedulable`` (the
scheduler's message), ``terminated``.
"""

from __future__ import annotations

from typing import Any

from . import conditions as C

#: Kubelet reasons of a container that waits and cannot start without a fix, and the
#: condition reason for each (the kubelet's own reason and message go into the message).
CANNOT_START = {
    "ErrImagePull": C.IMAGE_PULL_FAILED,
    "ImagePullBackOff": C.IMAGE_PULL_FAILED,
    "InvalidImageName": C.IMAGE_PULL_FAILED,
    "ErrImageNeverPull": C.IMAGE_PULL_FAILED,
    "CreateContainerConfigError": C.CONTAINER_CONFIG_ERROR,
    "CreateContainerError": C.CONTAINER_CONFIG_ERROR,
}


def cannot_start(pod: dict[str, Any]) -> tuple[str, str] | None:
    """(condition reason, message) of a pod whose container the kubelet cannot start: its
    image cannot be pulled, or a Secret, ConfigMap or key it references is missing."""
    reason = CANNOT_START.get(pod.get("waiting") or "")
    if reason is None:
        return None
    detail = f": {pod['waitingMessage']}" if pod.get("waitingMessage") else ""
    return reason, f"pod {pod.get('name')}: {pod['waiting']}{detail}"[:1024]


def unschedulable(pod: dict[str, Any]) -> str | None:
    """The scheduler's message for a pod no node fits, if it is waiting for one."""
    msg = pod.get("unschedulable")
    return str(msg) if msg else None


def running(pod: dict[str, Any]) -> bool:
    """The pod's container runs (it is past scheduling, pulling and creating)."""
    return pod.get("phase") == "Running" and not pod.get("waiting")
