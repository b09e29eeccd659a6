"""docs/verified-promotion.md shows what the operator's code does: each worked example between
``<!-- example: NAME -->`` and ``<!-- end -->`` is what tests/docs_examples.py computes with
the decision code today, every reason of the output check and the canary has one, and each
example shows the reason it is about (issue 44)."""

from __future__ import annotations

import difflib
import re

import pytest
from spyre_operator.api.v1alpha1 import CanaryStatus
from spyre_operator.decide import conditions as C

from tests import docs_examples as X

COMPUTED = X.blocks()


def _verification_reasons() -> set[str]:
    """The reasons users meet on the output check and canary path, as conditions.py and the
    API (status.canary.reason) name them: a new one there needs an example here."""
    canary = {v for k, v in vars(C).items() if k.startswith("CANARY_") and isinstance(v, str)}
    described = str(CanaryStatus.model_fields["reason"].description)
    named = {w for w in re.findall(r"\b[A-Z][A-Za-z]+\b", described) if w in vars(C).values()}
    return set(C.SERVING_REFUSED_REASONS) | canary | named | {
        C.WINDOW_PASSED, C.PROMOTED_BY_ANNOTATION, C.OUTPUT_MISMATCH}  # fmt: skip


def test_the_reasons_are_found() -> None:
    assert _verification_reasons() >= {
        C.OUTPUT_MISMATCH, C.CANARY_RUNNING, C.CANARY_AWAITING_TRAFFIC, C.WINDOW_PASSED,
        C.PROMOTED_BY_ANNOTATION, C.CANARY_FAILED, C.CANARY_DEADLINE_EXCEEDED, C.CANARY_ABORTED,
    }  # fmt: skip


@pytest.mark.parametrize("name", sorted(COMPUTED))
def test_the_page_holds_what_the_code_computes(name: str) -> None:
    held = X.page_blocks(X.PAGE.read_text())
    assert name in held, (
        f"{X.PAGE.name} has no block <!-- example: {name} --> ... <!-- end -->: add the markers "
        f"where it belongs, then run `{X.REGENERATE}`")
    if held[name] != COMPUTED[name]:
        diff = "".join(difflib.unified_diff(
            held[name].splitlines(keepends=True), COMPUTED[name].splitlines(keepends=True),
            "the page", "the code"))  # fmt: skip
        pytest.fail(
            f"{X.PAGE.name}'s example {name} is not what the operator's code computes; if the "
            f"code's change is meant, run `{X.REGENERATE}` (then reread the prose around it):"
            f"\n{diff}")


def test_the_page_holds_no_block_the_code_does_not_compute() -> None:
    extra = set(X.page_blocks(X.PAGE.read_text())) - set(COMPUTED)
    assert not extra, f"blocks with no example in tests/docs_examples.py: {sorted(extra)}"


@pytest.mark.parametrize("reason", sorted(_verification_reasons()))
def test_every_reason_has_a_worked_example(reason: str) -> None:
    text = X.PAGE.read_text()
    assert reason in X.EXAMPLES, f"tests/docs_examples.py has no example of {reason}"
    assert f"\n### {reason}\n" in text, f"{X.PAGE.name} has no section ### {reason}"
    assert f"<!-- example: {reason} -->" in text


@pytest.mark.parametrize("reason", sorted(X.EXAMPLES))
def test_each_example_shows_its_reason(reason: str) -> None:
    """A situation that no longer leads to its reason (the code changed what it decides)
    would regenerate into a block about something else: it must fail here instead."""
    shown = X.excerpt(reason)["status"]
    reasons = {c["reason"] for c in shown.get("conditions") or []}
    reasons |= {(shown.get(f) or {}).get("reason") for f in ("canary", "artifact")}
    assert (X.EXAMPLES[reason].reason or reason) in reasons, shown
