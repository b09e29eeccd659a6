"""The shared compile-cache PersistentVolumeClaim."""

from __future__ import annotations

from collections.abc import Iterable

from lightkube.models.core_v1 import PersistentVolumeClaimSpec, VolumeResourceRequirements
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import PersistentVolumeClaim

from ..api.v1alpha1 import CacheVolumeSpec
from . import names
from .owners import shared_refs
from .plan import OwnerRef


def cache_owners(
    volume_users: Iterable[tuple[OwnerRef, CacheVolumeSpec]],
    claim_name_users: Iterable[OwnerRef] = (),
) -> list[OwnerRef]:
    """Owners of a managed cache PVC: every SpyreModel naming it, but only if all of them
    ask for Delete. One Retain keeps the PVC (and its artifacts) out of garbage collection,
    and so does a SpyreModel that names it by cache.claimName (it asks for no deletion: the
    PVC must outlive the models that made it)."""
    users = list(volume_users)
    if not users or any(v.retain_policy != "Delete" for _, v in users):
        return []
    if any(True for _ in claim_name_users):
        return []
    return [o for o, _ in users]


def build_cache_pvc(
    namespace: str, volume: CacheVolumeSpec, owners: Iterable[OwnerRef]
) -> PersistentVolumeClaim:
    """A PVC the operator creates for cache.volume."""
    return PersistentVolumeClaim(
        metadata=ObjectMeta(
            name=volume.name,
            namespace=namespace,
            labels={**names.common_labels(names.COMPONENT_CACHE), names.CLAIM_LABEL: volume.name},
            ownerReferences=shared_refs(owners) or None,
        ),
        spec=PersistentVolumeClaimSpec(
            accessModes=list(volume.access_modes),
            storageClassName=volume.storage_class_name,
            resources=VolumeResourceRequirements(requests={"storage": str(volume.size)}),
        ),
    )
