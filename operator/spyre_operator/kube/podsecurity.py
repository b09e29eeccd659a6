"""Whether the platform assigns pods their user: ``--pod-user auto|assigned|fixed``.

OpenShift's default ``restricted-v2`` SCC gives every namespace a uid range and a
supplemental-group range (annotations ``openshift.io/sa.scc.uid-range`` and
``openshift.io/sa.scc.supplemental-groups``), assigns the first uid and fsGroup to pods that
set none, and refuses pods that pin one outside the range. A pod that pins the image's uid
(1001) is therefore refused there, while on plain Kubernetes a pod that pins none runs as the
image's USER and cannot write a fresh volume without an fsGroup. So the operator pins the uid
(``fixed``) unless the platform assigns one (``assigned``); ``auto`` asks the API server
whether it serves ``security.openshift.io/v1``, the API group of SecurityContextConstraints.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

POD_USER_CHOICES = ("auto", "assigned", "fixed")
#: The APIService an OpenShift API server registers for its SCC API group.
SCC_API_SERVICE = "v1.security.openshift.io"

log = logging.getLogger(__name__)


def scc_api_served() -> bool:
    """Whether the API server registers ``security.openshift.io/v1`` (an APIService, local for
    a CRD-served group, aggregated otherwise). Needs ``get`` on that APIService; the chart
    never needs it (it resolves ``auto`` from Helm's .Capabilities and passes the result). Any
    other error than NotFound propagates."""
    import httpx2
    from lightkube import ApiError, Client
    from lightkube.resources.apiregistration_v1 import APIService

    client = Client(timeout=httpx2.Timeout(30))
    try:
        client.get(APIService, SCC_API_SERVICE)
    except ApiError as e:
        if e.status.code == 404:
            return False
        raise
    finally:
        client.close()
    return True


def platform_assigns_user(mode: str, probe: Callable[[], bool] = scc_api_served) -> bool:
    """The ``--pod-user`` mode resolved: True when the operator's pods must leave uid, gid and
    fsGroup to the platform. ``auto`` probes the API server once, at start-up; when the probe
    fails (no permission, no answer) the error is raised: a guess would either pin a uid that
    OpenShift refuses or leave a fresh volume unwritable on plain Kubernetes."""
    if mode not in POD_USER_CHOICES:
        raise ValueError(f"--pod-user {mode!r}: expected one of {', '.join(POD_USER_CHOICES)}")
    if mode != "auto":
        return mode == "assigned"
    try:
        served = probe()
    except Exception as e:  # noqa: BLE001 - any failure: say which probe and what it got
        raise ValueError(
            f"--pod-user auto: could not ask the API server whether it serves "
            f"security.openshift.io/v1 (get apiservice {SCC_API_SERVICE}): {e}; "
            "set --pod-user assigned (OpenShift) or fixed (plain Kubernetes)"
        ) from None
    log.info(
        "Pod user: %s (the API server %s security.openshift.io/v1)",
        "assigned by the platform" if served else "pinned",
        "serves" if served else "does not serve",
    )
    return served
