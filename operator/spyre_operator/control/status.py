"""Status reporting (``Controller.status``): an unexpected failure reported, a model another
install writes left to it, a CRD that prunes status told, and the status last written
remembered until the cache shows it. Its state is its own (a cache: rebuilt from the models'
status and the other installs' Leases, never the only record)."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from ..decide import conditions as C
from . import peers
from .base import ControllerParts
from .common import CONFLICT_EVENT_SECONDS, CRD_OUTDATED, ModelKey
from .peer_leases import PeerLeases

log = logging.getLogger("spyre_operator.control.controller")  # the controller's


class StatusReporter:
    """Status reporting, the install conflicts and the status last written."""

    def __init__(self, controller: ControllerParts) -> None:
        self.c = controller
        #: key -> (uid, resourceVersion decided from, status written): see with_written_status.
        self.written: dict[ModelKey, tuple[str | None, str | None, dict[str, Any]]] = {}
        self.pruned_reported = False
        #: Other installs' Leases, asked when a model carries a stale stamp of one (peers.py).
        self.peer_leases = PeerLeases(controller.client, controller.writer.background)
        #: Models another install writes now, by that install (the metrics' gauge).
        self.yielded: dict[ModelKey, str] = {}
        #: model -> (other install, clock when reported): one Event per model and install per
        #: CONFLICT_EVENT_SECONDS while the conflict goes on.
        self.conflicts_reported: dict[ModelKey, tuple[str, float]] = {}

    def forget(self, key: ModelKey) -> None:
        """The model is gone: nothing of it is kept."""
        self.written.pop(key, None)
        self.yielded.pop(key, None)
        self.conflicts_reported.pop(key, None)

    async def report_failure(self, key: ModelKey, error: BaseException) -> None:
        """An unexpected error: Reconciling=True ReconcileError with its message and a Warning
        Event; every other field of status, and every child, stays as it is.

        Best effort: a failure to report is logged, the worker backs off either way.
        """
        model = self.c.caches.one("models", key)
        if model is None or model["metadata"].get("deletionTimestamp") or not self.c.may_write():
            return
        model = self.with_written_status(key, model)
        meta, old = model["metadata"], model.get("status") or {}
        message = f"reconcile failed, retrying: {type(error).__name__}: {error}"[:1024]
        cond = C.Cond(C.RECONCILING, C.TRUE, C.RECONCILE_ERROR, message)
        generation = meta.get("generation", 1)
        conds = C.set_condition(old.get("conditions"), cond, generation, self.c.clock())
        status = {**old, "conditions": conds}
        try:
            rv = await self.c.applier.apply_status(key[1], key[0], status, old)
            if rv is not None:
                self.remember(key, model, status)
                await self.c.applier.event(dict(model), "Warning", C.RECONCILE_ERROR, message)
        except Exception as e:  # noqa: BLE001 - reporting must not hide the original error
            log.warning("could not report the failure of %s/%s: %s", *key, e)

    def written_elsewhere(self, key: ModelKey, model: dict[str, Any]) -> bool:
        """Whether another install wrote this model's status within peer_window (peers.py):
        then nothing here writes to it (children, status, GC) until it looks again after the
        window; the conflict is logged, counted and told in a Warning Event on the model."""
        other = peers.foreign_stamp(model.get("status"), self.c.install or "", self.c.clock())
        lease = ""
        if other is not None and other.age >= self.c.peer_window:
            # stale: the other install stopped, or is idle; its Lease tells (peers.py)
            state = self.peer_leases.state(other.install)
            if state is None:  # being asked: look again once the answer is in
                self.c.queue.add_after(key, 1.0)
                return True
            lease = state
            if not peers.keeps(other, state, self.c.peer_window):
                other = None
        if other is None:
            if self.yielded.pop(key, None) is not None:
                log.info("%s/%s: no other install writes it now; reconciling it again", *key)
            return False
        self.c.queue.add_after(key, self.c.peer_window)
        self.yielded[key] = other.install
        now = time.monotonic()
        last = self.conflicts_reported.get(key)
        if last is not None and last[0] == other.install and now - last[1] < CONFLICT_EVENT_SECONDS:
            return True
        self.conflicts_reported[key] = (other.install, now)
        self.c.stats.conflicts += 1
        message = peers.conflict_message(other, self.c.install or "", lease)
        log.warning("%s/%s: %s: %s", *key, peers.CONFLICT_REASON, message)
        if self.c.may_write():  # an Event is a write: a standby replica leaves it to its leader
            self.c.writer.background(
                self.c.applier.event(dict(model), "Warning", peers.CONFLICT_REASON, message)
            )
        return True

    def report_pruned(self, model: Mapping[str, Any]) -> None:
        """The API server dropped status fields this write sent: the installed CRD is older
        than the operator, and what those fields record (the served spec, the waiting order,
        the install stamp) is lost at every write. Said once per process: an error in the log
        and a Warning Event on the model (then spyre_operator_status_fields_pruned)."""
        last = getattr(self.c.applier, "last_pruned", None)
        if not last or self.pruned_reported:
            return
        self.pruned_reported = True
        ns, name, lost = last
        message = (
            f"the API server dropped status fields the operator wrote ({', '.join(lost[:8])}): "
            "the installed SpyreModel CRD is older than this operator. Apply the CRD of this "
            "release (crds/serving.spyre.dev_spyremodels.yaml; helm upgrade does not update "
            "CRDs): until then rollbacks, budget order and install conflicts are unreliable"
        )
        log.error("%s/%s: %s", ns, name, message)
        event = self.c.applier.event(dict(model), "Warning", CRD_OUTDATED, message)
        self.c.writer.background(event)

    def with_written_status(self, key: ModelKey, model: dict[str, Any]) -> dict[str, Any]:
        """``model`` with the status this operator last wrote, if the cache has not caught up.

        Until the watch delivers our last write, that write is the newest status: deciding
        from the older cached status would rewrite the same status and post its transition
        Events a second time (it did under load, with concurrent reconciles). The cache has
        caught up once it holds any other version of the model than the one that write was
        decided from: from then on the live status is compared, so a status field another
        field manager changed is written back (it was not while the operator compared with
        its own last write).
        """
        meta = model["metadata"]
        written = self.written.get(key)
        if written is None:
            return model
        uid, decided_from, status = written
        if uid != meta.get("uid") or meta.get("resourceVersion") != decided_from:
            del self.written[key]
            return model
        return {**model, "status": status}

    def remember(
        self, key: ModelKey, model: Mapping[str, Any], status: dict[str, Any]
    ) -> None:
        """Decide from ``status`` until the cache holds a newer version than ``model``."""
        meta = model["metadata"]
        self.written[key] = (meta.get("uid"), meta.get("resourceVersion"), status)
