"""conditions: merging keeps lastTransitionTime unless status changes."""

from __future__ import annotations

from spyre_operator.decide import conditions as C


def test_merge_keeps_transition_time_when_status_unchanged() -> None:
    first = C.merge_conditions(None, [C.Cond(C.READY, C.FALSE, C.COMPILING, "a")], 1, "t1")
    second = C.merge_conditions(first, [C.Cond(C.READY, C.FALSE, C.ROLLING_OUT, "b")], 2, "t2")
    assert second[0]["lastTransitionTime"] == "t1"
    assert second[0]["reason"] == C.ROLLING_OUT and second[0]["observedGeneration"] == 2
    third = C.merge_conditions(second, [C.Cond(C.READY, C.TRUE, C.SERVING, "c")], 2, "t3")
    assert third[0]["lastTransitionTime"] == "t3"


def test_merge_orders_by_type() -> None:
    out = C.merge_conditions(
        None,
        [C.Cond(C.DEGRADED, C.FALSE, "x"), C.Cond(C.READY, C.TRUE, "y")],
        1,
        "t",
    )
    assert [c["type"] for c in out] == [C.READY, C.DEGRADED]


def test_transitions_and_event_types() -> None:
    old = C.merge_conditions(None, [C.Cond(C.READY, C.FALSE, C.COMPILING)], 1, "t")
    new = C.merge_conditions(old, [C.Cond(C.READY, C.FALSE, C.PRECOMPILE_FAILED)], 1, "t")
    assert [c["reason"] for c in C.transitions(old, new)] == [C.PRECOMPILE_FAILED]
    assert C.transitions(new, new) == []
    assert C.event_type(C.PRECOMPILE_FAILED) == "Warning"
    assert C.event_type(C.SERVING) == "Normal"
