"""apply.is_subset: the no-op detection that keeps idle resyncs write-free."""

from __future__ import annotations

from spyre_operator.desired.quantity import parse_quantity
from spyre_operator.kube.apply import is_subset


def test_defaulted_fields_in_live_are_ignored() -> None:
    assert is_subset({"a": 1}, {"a": 1, "b": 2})
    assert not is_subset({"a": 1, "c": 3}, {"a": 1, "b": 2})


def test_lists_match_elementwise() -> None:
    assert is_subset([{"n": "x"}], [{"n": "x", "d": 1}])
    assert not is_subset([{"n": "x"}], [{"n": "x"}, {"n": "y"}])


def test_quantities_compare_by_value() -> None:
    assert is_subset({"requests": {"memory": "1024Mi"}}, {"requests": {"memory": "1Gi"}})
    assert is_subset({"limits": {"cpu": "0.5"}}, {"limits": {"cpu": "500m"}})
    assert not is_subset({"limits": {"cpu": "1"}}, {"limits": {"cpu": "500m"}})
    assert parse_quantity("2Gi") == 2 * 2**30


def test_int_or_string() -> None:
    assert is_subset({"maxSurge": 0}, {"maxSurge": "0"})
    assert not is_subset({"maxSurge": 0}, {"maxSurge": 1})
