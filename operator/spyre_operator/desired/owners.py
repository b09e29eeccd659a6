"""ownerReferences: GC of children when their SpyreModels go away."""

from __future__ import annotations

from collections.abc import Iterable

from lightkube.models.meta_v1 import OwnerReference

from .. import GROUP, KIND, VERSION
from .plan import OwnerRef

API_VERSION = f"{GROUP}/{VERSION}"


def controller_ref(owner: OwnerRef) -> OwnerReference:
    """The single controlling owner of a per-model child."""
    return OwnerReference(
        apiVersion=API_VERSION,
        kind=KIND,
        name=owner.name,
        uid=owner.uid,
        controller=True,
        blockOwnerDeletion=True,
    )


def shared_refs(owners: Iterable[OwnerRef]) -> list[OwnerReference]:
    """Non-controlling owners of a shared child (a Job or a cache PVC), sorted by name.

    The child is garbage-collected when the last owner is deleted.
    """
    return [
        OwnerReference(apiVersion=API_VERSION, kind=KIND, name=o.name, uid=o.uid)
        for o in sorted(set(owners), key=lambda o: (o.name, o.uid))
    ]
