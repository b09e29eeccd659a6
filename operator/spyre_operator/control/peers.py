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
A stamp older than the window is an install that stopped, or one that has had nothing to
write: the stamp alone cannot tell them apart (an idle install writes nothing, on purpose).
Taking every stale stamp over made two live installs take idle models from each other every
window, a status write and a Warning Event each time. So a stale stamp is taken over by what
the other install's Lease says (the stamp names it; leader election renews it every few
seconds, so it is the install's heartbeat at no extra write):

- ``gone`` (no such Lease, or not renewed within its duration): the install stopped; this one
  takes the model over at once;
- ``held``: the install runs; this one leaves the model alone while the stamp is younger than
  HOLD_SECONDS (past that, an install alive but no longer watching this namespace would keep
  the model from everyone: taken over then, and a live owner takes it back once an hour);
- ``unknown`` (this install may not read it: the chart grants ``get`` on Leases only with
  cluster scope): taken over once the stamp is TAKEOVER_UNKNOWN_SECONDS old.

Pure: the controller passes the status, the Lease and the time.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

#: Event and log reason when another install writes a model this one watches.
CONFLICT_REASON = "OperatorConflict"
#: What the other install's Lease says (see the module's docstring).
LEASE_HELD, LEASE_GONE, LEASE_UNKNOWN = "held", "gone", "unknown"
#: A stale stamp of an install whose Lease is held is left alone until this old.
HOLD_SECONDS = 3600.0
#: A stale stamp of an install whose Lease cannot be read is taken over this old.
TAKEOVER_UNKNOWN_SECONDS = 900.0
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


def foreign_stamp(status: dict[str, Any] | None, install: str, now: str) -> ForeignWriter | None:
    """The other install that wrote ``status`` last, however long ago; None when it was this
    install, nobody, or the stamp cannot be read."""
    stamp = (status or {}).get(STAMP_FIELD) or {}
    other = stamp.get("install")
    if not other or other == install:
        return None
    written, at = _seconds(str(stamp.get("writtenAt"))), _seconds(now)
    if written is None or at is None:
        return None
    return ForeignWriter(other, stamp.get("identity"), max(0.0, at - written))


def foreign_writer(
    status: dict[str, Any] | None, install: str, now: str, window: float
) -> ForeignWriter | None:
    """The other install that wrote ``status`` within ``window`` seconds before ``now``; None
    when it was this install, nobody, or longer ago (see :func:`keeps` then)."""
    other = foreign_stamp(status, install, now)
    return other if other is not None and other.age < window else None


def lease_of(install: str) -> tuple[str, str] | None:
    """(namespace, name) of an install's Lease, from its id (:func:`install_id`)."""
    ns, _, name = install.partition("/")
    return (ns, name) if ns and name and "/" not in name else None


def lease_state(lease: dict[str, Any] | None, now: float) -> str:
    """LEASE_HELD when a holder renewed ``lease`` within its duration before ``now`` (seconds
    since the epoch), else LEASE_GONE (absent, released, expired)."""
    spec = (lease or {}).get("spec") or {}
    renewed = _seconds(str(spec.get("renewTime")))
    duration = spec.get("leaseDurationSeconds")
    if not spec.get("holderIdentity") or renewed is None or not duration:
        return LEASE_GONE
    return LEASE_HELD if now < renewed + float(duration) else LEASE_GONE


def keeps(other: ForeignWriter, lease: str, window: float) -> bool:
    """Whether the other install keeps the model: its stamp is fresh, or stale but its
    Lease held (up to HOLD_SECONDS) or unreadable (up to TAKEOVER_UNKNOWN_SECONDS)."""
    if other.age < window:
        return True
    if lease == LEASE_HELD:
        return other.age < HOLD_SECONDS
    if lease == LEASE_UNKNOWN:
        return other.age < TAKEOVER_UNKNOWN_SECONDS
    return False


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


def conflict_message(other: ForeignWriter, install: str, lease: str = "") -> str:
    """What the Event and the log say."""
    who = f"{other.install}" + (f" (replica {other.identity})" if other.identity else "")
    why = {
        LEASE_HELD: " and holds its Lease (it runs)",
        LEASE_UNKNOWN: (
            f" and this install may not read its Lease (get on coordination.k8s.io leases in "
            f"its namespace): it takes the model over once that write is "
            f"{TAKEOVER_UNKNOWN_SECONDS / 60:.0f} min old"
        ),
    }.get(lease, "")
    return (
        f"another spyre-model-operator install, {who}, wrote this SpyreModel {other.age:.0f}s "
        f"ago{why}; this install ({install}) leaves it alone while that one is active. Two "
        "installs watch this namespace: make their watch scopes (watch.namespaces, or one "
        "install with watch.allNamespaces) disjoint, or uninstall one"
    )
