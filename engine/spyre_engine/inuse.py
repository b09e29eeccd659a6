"""Which artifact keys of a cache claim are in use *now*: asked by ``spyre-engine gc`` right
before each removal, under the artifact's lock (see gc.py).

The operator decides what a GC Job removes when it creates the Job; by the time the pod runs,
a revert or a new SpyreModel may serve one of those keys again, and a model that moved to
another claim may still serve from this one. So the GC pod asks the API server itself, with
the namespace's ``spyre-gc`` ServiceAccount (list on pods, Jobs and Deployments, nothing
else), and skips a key that

* a pod of the namespace that has not ended (Pending included: it is about to load it)
  names in its ``serving.spyre.dev/artifact-key`` annotation and that mounts the claim;
* a Job that has not finished writes (same annotation on its pod template, claim mounted);
* a Deployment's pod template names, mounting the claim (its ReplicaSet may not have
  created the pod yet, or it is scaled to zero for now).

If the API cannot be asked (no token, forbidden, unreachable, a malformed answer), nothing
is removed (:class:`InUseUnknown`): the caller stops and says why.
"""

from __future__ import annotations

import json
import os
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from spyre_engine.weights import ModelUse, pod_models

#: The annotation the operator puts on every pod template that serves or writes a key
#: (operator: desired/names.py ARTIFACT_KEY_ANNOTATION; a unit test keeps them equal).
ARTIFACT_KEY_ANNOTATION = "serving.spyre.dev/artifact-key"
#: Only the operator's children carry the annotation: list those.
MANAGED_SELECTOR = "app.kubernetes.io/managed-by=spyre-model-operator"
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
REQUEST_TIMEOUT_SECONDS = 20.0

#: Lists what is in the namespace: resource ("pods", "jobs", "deployments") -> items.
Lister = Callable[[str], list[dict[str, Any]]]


class InUseUnknown(Exception):
    """What is in use cannot be told (the API server could not be asked): remove nothing."""


def _mounts(pod_spec: Mapping[str, Any], claim: str) -> bool:
    return any(
        ((v or {}).get("persistentVolumeClaim") or {}).get("claimName") == claim
        for v in pod_spec.get("volumes") or []
    )


def _job_finished(job: Mapping[str, Any]) -> bool:
    return any(
        c.get("status") == "True" and c.get("type") in ("Complete", "Failed")
        for c in (job.get("status") or {}).get("conditions") or []
    )


def _live_users(
    claim: str,
    pods: list[dict[str, Any]],
    jobs: list[dict[str, Any]],
    deployments: list[dict[str, Any]],
) -> Iterator[tuple[str, Mapping[str, Any], Mapping[str, Any], Mapping[str, Any]]]:
    """What mounts ``claim`` and may use it now: pods that have not ended (Pending included),
    Jobs that have not finished and Deployments (their pods may be about to start). Each as
    (kind, its metadata, the pod's or pod template's annotations, the pod spec)."""
    for pod in pods:
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        if _mounts(spec, claim):
            yield "pod", meta, meta.get("annotations") or {}, spec
    for kind, items in (("job", jobs), ("deployment", deployments)):
        for obj in items:
            if kind == "job" and _job_finished(obj):
                continue
            template = (obj.get("spec") or {}).get("template") or {}
            spec = template.get("spec") or {}
            if _mounts(spec, claim):
                annotations = (template.get("metadata") or {}).get("annotations") or {}
                yield kind, obj.get("metadata") or {}, annotations, spec


def users_of(
    key: str,
    claim: str,
    pods: list[dict[str, Any]],
    jobs: list[dict[str, Any]],
    deployments: list[dict[str, Any]],
) -> list[str]:
    """What uses ``key`` on ``claim`` now (``kind/name`` each), from the listed objects."""
    return sorted(
        f"{kind}/{meta.get('name')}"
        for kind, meta, annotations, _ in _live_users(claim, pods, jobs, deployments)
        if annotations.get(ARTIFACT_KEY_ANNOTATION) == key
    )


def models_in_use(
    claim: str,
    pods: list[dict[str, Any]],
    jobs: list[dict[str, Any]],
    deployments: list[dict[str, Any]],
) -> dict[str, ModelUse]:
    """The downloaded models (weights.py) that what mounts ``claim`` runs now, by hub folder;
    a Job (or a pod of one) may be downloading its model."""
    out: dict[str, ModelUse] = {}
    for kind, meta, _, spec in _live_users(claim, pods, jobs, deployments):
        downloading = kind == "job" or kind == "pod" and any(
            r.get("kind") == "Job" for r in meta.get("ownerReferences") or [])
        for ref in pod_models(dict(spec)):
            use = out.setdefault(ref.folder, ModelUse())
            use.users.append(f"{kind}/{meta.get('name')}")
            use.revisions.add(ref.revision)
            use.downloading = use.downloading or downloading
    for use in out.values():
        use.users.sort()
    return out


class InUseCheck:
    """``check(key)``: why ``key`` is in use on the claim now (None: unused); lists afresh
    on every call. Raises :class:`InUseUnknown` when it cannot tell."""

    def __init__(self, claim: str, lister: Lister) -> None:
        self.claim = claim
        self.lister = lister

    def models(self) -> dict[str, ModelUse]:
        """The downloaded models in use on the claim now (:func:`models_in_use`)."""
        return models_in_use(
            self.claim, self.lister("pods"), self.lister("jobs"), self.lister("deployments")
        )

    def __call__(self, key: str) -> str | None:
        users = users_of(
            key,
            self.claim,
            self.lister("pods"),
            self.lister("jobs"),
            self.lister("deployments"),
        )
        if not users:
            return None
        more = f" and {len(users) - 3} more" if len(users) > 3 else ""
        return f"in use by {', '.join(users[:3])}{more}"


_PATHS = {
    "pods": "/api/v1/namespaces/{ns}/pods",
    "jobs": "/apis/batch/v1/namespaces/{ns}/jobs",
    "deployments": "/apis/apps/v1/namespaces/{ns}/deployments",
}


def api_lister(
    namespace: str,
    server: str | None = None,
    token: str | None = None,
    ca_file: Path | None = None,
) -> Lister:
    """List through the API server with the pod's ServiceAccount (in-cluster defaults: the
    ``kubernetes`` Service from the env, the mounted token and CA)."""
    sa = SERVICE_ACCOUNT_DIR
    if server is None:
        host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get(
            "KUBERNETES_SERVICE_PORT", "443"
        )
        if not host:
            raise InUseUnknown("not in a cluster: KUBERNETES_SERVICE_HOST is not set")
        server = f"https://{'[' + host + ']' if ':' in host else host}:{port}"
    try:
        if token is None:
            token = (sa / "token").read_text().strip()
        context = ssl.create_default_context(cafile=str(ca_file or sa / "ca.crt"))
    except (OSError, ssl.SSLError) as exc:
        raise InUseUnknown(
            f"no ServiceAccount credentials to ask the API server ({exc}); is "
            "automountServiceAccountToken off?"
        ) from exc

    def list_(resource: str) -> list[dict[str, Any]]:
        query = urllib.parse.urlencode({"labelSelector": MANAGED_SELECTOR})
        url = f"{server}{_PATHS[resource].format(ns=namespace)}?{query}"
        req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
        try:
            with urllib.request.urlopen(
                req, timeout=REQUEST_TIMEOUT_SECONDS, context=context
            ) as resp:
                doc = json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            detail = exc.read()[:300].decode(errors="replace")
            raise InUseUnknown(f"listing {resource}: HTTP {exc.code}: {detail}") from exc
        except (OSError, ValueError) as exc:
            raise InUseUnknown(f"listing {resource}: {exc}") from exc
        items = doc.get("items") if isinstance(doc, dict) else None
        if not isinstance(items, list):
            raise InUseUnknown(f"listing {resource}: the answer has no items")
        return items

    return list_


__all__ = [
    "ARTIFACT_KEY_ANNOTATION",
    "InUseCheck",
    "InUseUnknown",
    "api_lister",
    "models_in_use",
    "users_of",
]
