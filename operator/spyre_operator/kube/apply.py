"""The only module that writes to the API server.

Children are written with server-side apply under one field manager. Before each write the
desired object is compared with the live one from the watch cache: when every field we would
set already has that value, nothing is sent, so an idle resync makes zero API writes.

"Every field we would set" is not enough on its own: a field the operator stops setting (a
removed label, env entry, toleration, the cache PVC's ownerReferences after a switch to
``retainPolicy: Retain``) is still on the live object, so the desired object stays a subset
and nothing would be written. Each applied object therefore carries a hash of the whole
desired object in an annotation; when the desired object changes, so does the hash, the
apply is sent, and server-side apply removes every field this field manager owned and no
longer sets.
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
from collections import Counter
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from lightkube import ApiError, AsyncClient
from lightkube.generic_resource import create_namespaced_resource
from lightkube.models.core_v1 import EventSource, ObjectReference
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import Event, PersistentVolumeClaim
from lightkube.types import CascadeType, PatchType

from .. import FIELD_MANAGER, GROUP, KIND, PLURAL, VERSION
from ..desired.names import ROLLED_OUT_LABEL
from ..desired.quantity import parse_quantity

#: Hash of the desired object last applied (see the module docstring).
APPLIED_HASH_ANNOTATION = f"{GROUP}/applied-hash"

log = logging.getLogger(__name__)

SpyreModelResource = create_namespaced_resource(GROUP, VERSION, KIND, PLURAL)

def build_event(
    model: dict[str, Any], type_: str, reason: str, message: str, instance: str
) -> Event:
    """An Event on a SpyreModel, named ``<model>.<16 hex digits>`` like client-go's: 17
    characters longer than the model's name (the CRD caps that at api MAX_MODEL_NAME)."""
    meta = model["metadata"]
    now = datetime.now(UTC).replace(microsecond=0)
    return Event(
        metadata=ObjectMeta(
            name=f"{meta['name']}.{secrets.token_hex(8)}", namespace=meta["namespace"]
        ),
        involvedObject=ObjectReference(
            apiVersion=f"{GROUP}/{VERSION}",
            kind=KIND,
            name=meta["name"],
            namespace=meta["namespace"],
            uid=meta.get("uid"),
            resourceVersion=meta.get("resourceVersion"),
        ),
        reason=reason,
        message=message[:1024],
        type=type_,
        count=1,
        firstTimestamp=now,
        lastTimestamp=now,
        source=EventSource(component="spyre-model-operator"),
        reportingComponent="serving.spyre.dev/spyre-model-operator",
        reportingInstance=instance,
    )


_QUANTITY_PARENTS = frozenset({"requests", "limits", "capacity"})


def is_subset(desired: Any, live: Any, parent: str = "") -> bool:
    """Whether every field of ``desired`` has the same value in ``live``.

    Fields the API server defaults (present only in ``live``) are ignored. Lists must have the
    same length and match element-wise. Resource quantities compare by value, because the API
    server may canonicalise them ("1024Mi" -> "1Gi").
    """
    if isinstance(desired, dict):
        if not isinstance(live, dict):
            return False
        in_quantities = parent in _QUANTITY_PARENTS
        return all(
            k in live and is_subset(v, live[k], "quantity" if in_quantities else k)
            for k, v in desired.items()
        )
    if isinstance(desired, list):
        if not isinstance(live, list) or len(desired) != len(live):
            return False
        return all(is_subset(d, v, parent) for d, v in zip(desired, live, strict=True))
    if desired == live:
        return True
    if parent == "quantity":
        a, b = parse_quantity(desired), parse_quantity(live)
        return a is not None and a == b
    # int-or-string fields (e.g. maxSurge: 0 vs "0") compare as strings
    return isinstance(desired, int | str) and str(desired) == str(live)


#: Labels that are records of what the operator saw, not desired state: left out of the hash,
#: so writing one changes no annotation (a Deployment's annotations are part of its generation).
UNHASHED_LABELS = frozenset({ROLLED_OUT_LABEL})


def with_applied_hash(desired: dict[str, Any]) -> dict[str, Any]:
    """``desired`` with the hash of its own content (records aside) in an annotation."""
    meta = desired.setdefault("metadata", {})
    annotations = {
        k: v for k, v in (meta.get("annotations") or {}).items() if k != APPLIED_HASH_ANNOTATION
    }
    meta["annotations"] = annotations or None
    hashed = desired
    if UNHASHED_LABELS & set(meta.get("labels") or {}):
        labels = {k: v for k, v in meta["labels"].items() if k not in UNHASHED_LABELS}
        hashed = {**desired, "metadata": {**meta, "labels": labels}}
    doc = json.dumps(hashed, sort_keys=True, separators=(",", ":"), default=str)
    annotations[APPLIED_HASH_ANNOTATION] = hashlib.sha256(doc.encode()).hexdigest()[:16]
    meta["annotations"] = annotations
    return desired


#: The field manager of the records the operator keeps on objects it also applies (``annotate``).
RECORD_FIELD_MANAGER = f"{FIELD_MANAGER}-records"


#: Key of a cached SpyreModel (handlers.index_models): the top-level status fields the
#: operator's field manager owns on the live object (None: unknown), from its managedFields.
STATUS_FIELDS_KEY = "x-spyre-status-fields"


def status_fields_owned(metadata: Mapping[str, Any]) -> list[str] | None:
    """The top-level ``status`` fields FIELD_MANAGER applied (its managedFields entry on the
    status subresource); None when the object carries no managedFields."""
    entries = metadata.get("managedFields")
    if entries is None:
        return None
    out: set[str] = set()
    for e in entries or []:
        if e.get("manager") != FIELD_MANAGER or e.get("subresource") != "status":
            continue
        status = ((e.get("fieldsV1") or {}).get("f:status")) or {}
        out |= {k[2:] for k in status if k.startswith("f:")}
    return sorted(out)


def comparable_status(live: Mapping[str, Any] | None, desired: Mapping[str, Any],
                      owned: list[str] | None) -> dict[str, Any] | None:
    """The live status as far as the operator's apply of ``desired`` decides it: fields
    another field manager set alone (not in ``desired``, not the operator's) are left out. A
    status apply never removes them, so comparing with them wrote on every reconcile."""
    if live is None or owned is None:
        return None if live is None else dict(live)
    keep = set(desired) | set(owned)
    return {k: v for k, v in live.items() if k in keep}


def pruned(sent: Mapping[str, Any], got: Mapping[str, Any], parent: str = "status") -> list[str]:
    """Fields of ``sent`` (nested objects too) that the API server's answer lacks: it pruned
    them, because the installed CRD's schema does not know them (a CRD older than the
    operator: helm keeps CRDs on upgrade)."""
    out = []
    for k, v in sent.items():
        if v is None:
            continue
        path = f"{parent}.{k}"
        if k not in got:
            out.append(path)
        elif isinstance(v, Mapping) and isinstance(got[k], Mapping):
            out += pruned(v, got[k], path)
    return out


class Applier:
    """Writes desired objects, skipping no-ops, and counts what it wrote."""

    def __init__(self, client: AsyncClient, instance: str = "spyre-model-operator") -> None:
        self.client = client
        self.instance = instance
        self.writes: Counter[str] = Counter()
        #: writes per namespace: a test counts the writes for its own models only
        self.namespace_writes: Counter[str] = Counter()
        self.skipped = 0
        #: status fields the API server dropped from the operator's writes: its CRD is older
        #: than this operator's (structural pruning), see ``pruned``
        self.pruned: set[str] = set()
        self.last_pruned: tuple[str, str, list[str]] | None = None

    def _count(self, verb: str, kind: str, namespace: str | None) -> None:
        self.writes[f"{verb} {kind}"] += 1
        self.namespace_writes[namespace or ""] += 1

    async def apply(self, obj: Any, live: dict[str, Any] | None) -> bool:
        """Server-side apply ``obj`` unless ``live`` already matches. Returns True if written."""
        desired = with_applied_hash(obj.to_dict())
        obj = type(obj).from_dict(desired)
        if live is not None and is_subset(desired, live):
            self.skipped += 1
            return False
        await self.client.apply(obj, field_manager=FIELD_MANAGER, force=True)
        self._count("apply", desired["kind"], desired["metadata"].get("namespace"))
        log.info(
            "%s %s %s/%s",
            "Created" if live is None else "Updated",
            desired["kind"],
            desired["metadata"].get("namespace"),
            desired["metadata"]["name"],
        )
        return True

    async def ensure_job(self, job: Job, live: dict[str, Any] | None) -> bool:
        """Create the precompile Job if absent; else only reconcile its owners.

        A Job's pod template is immutable and a shared Job's template comes from whichever
        SpyreModel created it, so an existing Job is never re-applied, only its ownerReferences
        are patched (guarded by resourceVersion against concurrent edits).
        """
        if live is None:
            return await self.apply(job, None)
        meta = job.metadata
        assert meta is not None and meta.name is not None
        desired_refs = [r.to_dict() for r in meta.ownerReferences or []]
        live_refs = live.get("metadata", {}).get("ownerReferences") or []
        if {r["uid"] for r in desired_refs} == {r.get("uid") for r in live_refs}:
            self.skipped += 1
            return False
        patch = {
            "metadata": {
                "ownerReferences": desired_refs,
                "resourceVersion": live["metadata"]["resourceVersion"],
            }
        }
        await self.client.patch(
            Job,
            meta.name,
            patch,
            namespace=meta.namespace,
            patch_type=PatchType.MERGE,
            field_manager=FIELD_MANAGER,
        )
        self._count("patch", "Job", meta.namespace)
        log.info("Updated owners of Job %s/%s", meta.namespace, meta.name)
        return True

    async def release_owner(
        self, pvc: Mapping[str, Any], keep: list[dict[str, Any]], model: str
    ) -> None:
        """Drop a SpyreModel from a cache PVC's ownerReferences (``keep``: the others).

        A JSON merge patch of ownerReferences alone, guarded by the resourceVersion the
        decision was made on (a concurrent change is a 409: decided again); server-side apply
        would need the whole PVC as this field manager last applied it.
        """
        meta = pvc["metadata"]
        patch = {
            "metadata": {"ownerReferences": keep, "resourceVersion": meta["resourceVersion"]}
        }
        await self.client.patch(
            PersistentVolumeClaim,
            meta["name"],
            patch,
            namespace=meta["namespace"],
            patch_type=PatchType.MERGE,
            field_manager=FIELD_MANAGER,
        )
        self._count("patch", "PersistentVolumeClaim", meta["namespace"])
        log.info(
            "Released PVC %s/%s from SpyreModel %s (it names another cache claim)",
            meta["namespace"],
            meta["name"],
            model,
        )

    async def owner_exists(self, model: Mapping[str, Any]) -> bool:
        """Whether ``model`` (its UID) is in the API server: asked before a child is created,
        since after a watch gap the caches may hold a model deleted meanwhile, and an object
        created for it would be the garbage collector's, again and again (control/resync.py)."""
        meta = model["metadata"]
        # A list by name, not a get: the verbs the operator already has on SpyreModels (its
        # watches), so no RBAC changes with this question (the chart grants list and watch).
        async for live in self.client.list(SpyreModelResource, namespace=meta["namespace"],
                                           fields={"metadata.name": meta["name"]}):
            if live.metadata is not None and live.metadata.uid == meta.get("uid"):
                return True
        return False

    async def named(self, resource: type, name: str, namespace: str) -> dict[str, Any] | None:
        """The object ``name`` of ``resource`` in ``namespace`` as the API server has it, or
        None: for a kind the operator watches only with its own labels (ConfigMaps), a
        same-named object of someone else's is found here before the first write, never
        taken over. A list by name: the verbs the operator already has (its watches)."""
        found: Any
        async for found in self.client.list(resource, namespace=namespace,
                                            fields={"metadata.name": name}):
            return found.to_dict()  # type: ignore[no-any-return]
        return None

    async def delete(self, resource: type, name: str, namespace: str) -> bool:
        """Delete a child (dependents are garbage-collected in the background)."""
        try:
            await self.client.delete(
                resource, name, namespace=namespace, cascade=CascadeType.BACKGROUND
            )
        except ApiError as e:
            if e.status.code == 404:
                return False
            raise
        self._count("delete", resource.__name__, namespace)
        log.info("Deleted %s %s/%s", resource.__name__, namespace, name)
        return True

    async def annotate(
        self, resource: type, name: str, namespace: str, annotations: dict[str, str]
    ) -> None:
        """Server-side apply ``annotations`` on an existing object as a field manager of their
        own (RECORD_FIELD_MANAGER): the operator's applies of the object, which leave them
        out, do not remove them. A record the operator keeps on the cluster, not in memory."""
        obj = resource(metadata=ObjectMeta(name=name, namespace=namespace,
                                           annotations=annotations))
        await self.client.apply(obj, field_manager=RECORD_FIELD_MANAGER, force=True)
        self._count("apply", f"{resource.__name__}/annotations", namespace)

    async def apply_status(
        self, name: str, namespace: str, status: dict[str, Any], current: dict[str, Any] | None
    ) -> str | None:
        """Server-side apply the status subresource, unless ``current`` (the live status, or
        what this operator wrote last while the watch has not delivered it) is equal.

        Returns the resourceVersion written ("" if the server sent none), None if skipped.
        Applied with force: a status field another field manager took over is taken back.
        """
        if current == status:
            self.skipped += 1
            return None
        obj = SpyreModelResource.Status(
            apiVersion=f"{GROUP}/{VERSION}",
            kind=KIND,
            metadata=ObjectMeta(name=name, namespace=namespace),
            status=status,
        )
        written = await self.client.apply(obj, field_manager=FIELD_MANAGER, force=True)
        self._count("apply", "SpyreModel/status", namespace)
        got = getattr(written, "status", None)
        if isinstance(got, Mapping):
            lost = pruned(status, got)
            if lost:
                self.pruned.update(lost)
                self.last_pruned = (namespace, name, lost)
        meta = getattr(written, "metadata", None)
        return str(getattr(meta, "resourceVersion", None) or "")

    async def event(self, model: dict[str, Any], type_: str, reason: str, message: str) -> None:
        """Record a Kubernetes Event on a SpyreModel (best effort)."""
        meta = model["metadata"]
        ev = build_event(model, type_, reason, message, self.instance)
        try:
            await self.client.create(ev)
            self._count("create", "Event", meta["namespace"])
        except ApiError as e:  # events are informational; never fail a reconcile on them
            log.warning("could not record event %s on %s: %s", reason, meta["name"], e)
