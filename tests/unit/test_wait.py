"""The polling helpers the cluster tests wait with: an assertion inside a wait fails the test."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from typing import Any

import pytest

from tests.cluster.controlplane import KubectlError, NotYet, wait_until
from tests.integration.conftest import Kube


def calls(*steps: Any) -> tuple[Callable[[], Any], list[int]]:
    """A predicate that raises or returns ``steps`` in turn (the last one repeats)."""
    count = [0]

    def predicate() -> Any:
        step = steps[min(count[0], len(steps) - 1)]
        count[0] += 1
        if isinstance(step, BaseException):
            raise step
        return step

    return predicate, count


def test_an_assertion_inside_the_wait_fails_at_once() -> None:
    predicate, count = calls(False, AssertionError("one Job at a time"), True)
    with pytest.raises(AssertionError, match="one Job at a time"):
        wait_until(predicate, 30, "two retries", interval=0.01)
    assert count[0] == 2  # at once: no call after the assertion


def test_an_unexpected_error_ends_the_wait_at_once() -> None:
    predicate, count = calls(RuntimeError("operator exited with 1"), True)
    with pytest.raises(RuntimeError, match="operator exited"):
        wait_until(predicate, 30, "the operator", interval=0.01)
    assert count[0] == 1


@pytest.mark.parametrize("transient", [
    ConnectionRefusedError(111, "Connection refused"),
    KubectlError(1, ["kubectl", "--kubeconfig", "k", "get", "x"], "", "NotFound"),
    KeyError("status"),
    IndexError("list index out of range"),
    TypeError("'NoneType' object is not subscriptable"),
    AttributeError("'NoneType' object has no attribute 'get'"),
    TypeError("argument of type 'NoneType' is not iterable"),
    TypeError("object of type 'NoneType' has no len()"),
    NotYet("2 of 3 replicas"),
])
def test_a_not_yet_error_then_success_returns_the_value(transient: Exception) -> None:
    predicate, count = calls(transient, transient, {"ready": True})
    assert wait_until(predicate, 30, "the thing", interval=0.01) == {"ready": True}
    assert count[0] == 3


@pytest.mark.parametrize("bug", [
    TypeError("wait() takes 1 positional argument but 2 were given"),
    TypeError("'<' not supported between instances of 'str' and 'int'"),
    AttributeError("'Kube' object has no attribute 'modle'"),
    ValueError("invalid literal for int() with base 10: 'abc'"),
    StopIteration(),
])
def test_a_bug_in_the_predicate_ends_the_wait_at_once(bug: Exception) -> None:
    """Not a 900 s timeout: a wrong call, a misspelt attribute, a bad conversion are no "not
    yet"; only the named ones are (and TypeError/AttributeError about None)."""
    predicate, count = calls(bug, True)
    with pytest.raises(type(bug)):
        wait_until(predicate, 30, "the thing", interval=0.01)
    assert count[0] == 1


def test_the_deadline_error_names_and_chains_the_last_error() -> None:
    last = KubectlError(1, ["kubectl", "--kubeconfig", "k", "get", "pod", "p"], "",
                        'pods "p" not found')
    predicate, _ = calls(ConnectionRefusedError(111, "Connection refused"), False, last)
    with pytest.raises(TimeoutError) as info:
        wait_until(predicate, 0.3, "pod p", interval=0.01)
    msg = str(info.value)
    assert msg.startswith("timed out after 0s waiting for pod p"), msg
    assert "KubectlError" in msg and 'pods "p" not found' in msg, msg
    assert info.value.__cause__ is last


def test_a_falsy_predicate_times_out_without_an_error() -> None:
    predicate, count = calls(0)
    with pytest.raises(TimeoutError, match=r"waiting for nothing$"):
        wait_until(predicate, 0.2, "nothing", interval=0.01)
    assert count[0] >= 2


def test_kube_wait_lets_an_assertion_out() -> None:
    """The integration tests' ``kube.wait`` polls with ``wait_until``: same contract."""
    kube = Kube(cp=None, namespace="t")  # type: ignore[arg-type]
    predicate, count = calls(None, AssertionError("one Job at a time"))
    with pytest.raises(AssertionError, match="one Job at a time"):
        kube.wait(predicate, 30, "retries")
    assert count[0] == 2


def test_subprocess_timeouts_are_not_yet() -> None:
    predicate, _ = calls(subprocess.TimeoutExpired(["kubectl"], 5), "done")
    assert wait_until(predicate, 30, "kubectl", interval=0.01) == "done"
