"""Notice a second operator install writing the same SpyreModels, and keep out of its way.

Leader election keeps the replicas of one install from writing at once, but each install has
its own Lease (in its release namespace, named after the release): two installs whose watch
scopes overlap both lead, and both would write every model in the overlap, each undoing the
other's writes. So every status write carries a stamp, ``status.operator``: which install
(``<Lease namespace>/<Lease name>``), which replica, and when. Before reconciling a model an
operator reads the stamp; written by another install within the conflict window (two lease
durations), that install is alive and writes this model: this operator writes nothing to the
model (children, status, garbage collection), says so (a Warning Event ``OperatorConflict`` on
the model, a log line, ``spyre_operator_conflicts_total``) and looks again after the window.
A stamp older than the window is an install that stopped (or has had nothing to write): this
one takes over, and if the other is still there it notices the fresh stamp and reports in turn.

Pure: the controller passes the status and the time.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

#: Event and log reason when another install writes a model this one watches.
CONFLICT_REASON = "OperatorConflict"
#: ``status.operator``: the stamp of the install that wrote the status last.
STAMP_FIELD = "operator"


def install_id(lease_namespace: str, lease_name: str) -> str:
    """An install's identity: its Lease (unique per release; replicas share it)."""
    return f"{lease_namespace}/{lease_name}"


@dataclass(frozen=True)
class ForeignWriter:
    """Another install that wrote a model's status ``age`` seconds ago."""

    install: str
    identity: str | None
    age: float


def _seconds(rfc3339: str) -> float | None:
    try:
        t = datetime.fromisoformat(rfc3339)
    except (TypeError, ValueError):
        return None
    return (t if t.tzinfo else t.replace(tzinfo=UTC)).timestamp()


def foreign_writer(
    status: dict[str, Any] | None, install: str, now: str, window: float
) -> ForeignWriter | None:
    """The other install that wrote ``status`` within ``window`` seconds before ``now``; None
    when it was this install, nobody, or too long ago (an install that stopped)."""
    stamp = (status or {}).get(STAMP_FIELD) or {}
    other = stamp.get("install")
    if not other or other == install:
        return None
    written, at = _seconds(str(stamp.get("writtenAt"))), _seconds(now)
    if written is None or at is None or at - written >= window:
        return None
    return ForeignWriter(other, stamp.get("identity"), max(0.0, at - written))


def stamped(
    status: dict[str, Any],
    live: dict[str, Any] | None,
    install: str,
    identity: str,
    now: str,
) -> dict[str, Any]:
    """``status`` with this install's stamp. The live stamp is kept when it is this install's
    and nothing else changes, so that a reconcile with nothing to do still writes nothing."""
    live = live or {}
    live_stamp = live.get(STAMP_FIELD) or {}
    rest = {k: v for k, v in status.items() if k != STAMP_FIELD}
    live_rest = {k: v for k, v in live.items() if k != STAMP_FIELD}
    if rest == live_rest and live_stamp.get("install") == install:
        return {**rest, STAMP_FIELD: live_stamp}
    return {**rest, STAMP_FIELD: {"install": install, "identity": identity, "writtenAt": now}}


def conflict_message(other: ForeignWriter, install: str) -> str:
    """What the Event and the log say."""
    who = f"{other.install}" + (f" (replica {other.identity})" if other.identity else "")
    return (
        f"another spyre-model-operator install, {who}, wrote this SpyreModel {other.age:.0f}s "
        f"ago; this install ({install}) leaves it alone while that one is active. Two installs "
        "watch this namespace: make their watch scopes (watch.namespaces, or one install with "
        "watch.allNamespaces) disjoint, or uninstall one"
    )
