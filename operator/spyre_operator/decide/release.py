"""Release the managed cache claims a SpyreModel no longer names (pure, no I/O).

A model that moves off a ``retainPolicy: Delete`` claim (another ``cache.volume.name``, or a
``cache.claimName``) still appears in that PVC's ownerReferences, so the PVC would live as
long as the model although nothing names it, and be deleted with the model much later.
Releasing it means: drop the model's ownerReference; when no other SpyreModel owns or names
the PVC any more, delete it (``Delete``: "garbage-collected once no SpyreModel naming it
remains").

Never while the model's pods may still read from it: its Deployment serves from the old
claim until the new claim's artifact is ready, and its old pods run until its rollout
completes. And a PVC is deleted only once no Deployment of the operator in the namespace
mounts it and no unfinished Job of the operator writes to it; dropping an ownerReference
while other owners or users remain deletes nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..desired import names


@dataclass(frozen=True)
class Release:
    """What to do with one PVC the model owns and no longer names."""

    pvc: Mapping[str, Any]
    #: The ownerReferences it keeps; None: delete the PVC (nobody owns or names it).
    keep: list[dict[str, Any]] | None

    @property
    def name(self) -> str:
        return str((self.pvc.get("metadata") or {}).get("name"))


def mounted_claims(deployment: Mapping[str, Any] | None) -> set[str]:
    """The PVCs a Deployment's pods mount."""
    spec = (((deployment or {}).get("spec") or {}).get("template") or {}).get("spec") or {}
    return {
        str(v["persistentVolumeClaim"]["claimName"])
        for v in spec.get("volumes") or []
        if (v.get("persistentVolumeClaim") or {}).get("claimName")
    }


#: The PVC a spec without ``cache`` uses (CacheVolumeSpec's default name).
DEFAULT_CLAIM = "spyre-compile-cache"


def claim_named_by(spec: Mapping[str, Any] | None) -> str | None:
    """The cache claim a SpyreModel's spec names, read without validating it: a spec that
    fails validation now (stricter rules after an operator upgrade) still names its claim,
    and that claim must not be deleted under it."""
    cache = (spec or {}).get("cache")
    if cache is not None and not isinstance(cache, Mapping):
        return None
    cache = cache or {}
    if cache.get("claimName"):
        return str(cache["claimName"])
    volume = cache.get("volume")
    if volume is not None and not isinstance(volume, Mapping):
        return None
    return str((volume or {}).get("name") or DEFAULT_CLAIM)


def rollout_complete(deployment: Mapping[str, Any] | None) -> bool:
    """No pod of an older ReplicaSet is left (they may mount a claim the template no longer
    names); a Deployment not observed since its last edit is not complete."""
    if deployment is None:
        return True
    st = deployment.get("status") or {}
    gen = (deployment.get("metadata") or {}).get("generation", 0)
    if st.get("observedGeneration", 0) < gen:
        return False
    return (st.get("replicas") or 0) <= (st.get("updatedReplicas") or 0)


def claims_to_release(
    owner_uid: str,
    claim: str,
    pvcs: Iterable[Mapping[str, Any]],
    mounted: set[str],
    in_use: set[str],
    named: set[str],
) -> list[Release]:
    """The operator's PVCs (``pvcs``: the namespace's) owned by ``owner_uid`` but not its spec's
    ``claim``, with what to do with each.

    ``mounted``: the claims the model's own pods mount (left as they are). ``in_use``: the
    claims any pod of the operator may read or write (never deleted). ``named``: the claims
    some SpyreModel of the namespace names (cache.volume or cache.claimName): such a claim
    is only dropped from, never deleted.
    """
    out = []
    for pvc in pvcs:
        meta = pvc.get("metadata") or {}
        name = meta.get("name")
        if name == claim or name in mounted or meta.get("deletionTimestamp"):
            continue
        if (meta.get("labels") or {}).get(names.MANAGED_BY) != names.MANAGED_BY_VALUE:
            continue  # not the operator's: never modified
        refs = meta.get("ownerReferences") or []
        if not any(r.get("uid") == owner_uid for r in refs):
            continue
        keep = [dict(r) for r in refs if r.get("uid") != owner_uid]
        if keep or name in named:
            out.append(Release(pvc, keep))
        elif name not in in_use:
            out.append(Release(pvc, None))
    return out
