"""Every reason a SpyreModel's conditions can carry says what to do (issue 47, 4).

Walks every reason constant in conditions.py: each has a row in docs/troubleshooting.md's
reasons table (or, for the output check's and the canary's, a worked example in
docs/verified-promotion.md), and that row's "What to do" names something a user can act on: a
field, a command or a setting (in backticks or a link), or says there is nothing to do or only
to wait. A reason added without its remedy fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from spyre_operator import conditions as C

DOCS = Path(__file__).resolve().parents[2] / "docs"
TROUBLESHOOTING = DOCS / "troubleshooting.md"
PROMOTION = DOCS / "verified-promotion.md"
#: A remedy that is no action at all, for reasons that report a good state or a designed wait.
NO_ACTION = re.compile(r"^(nothing|wait)\b", re.I)
#: Something to act on: `a field, a command or a setting`, or a link to where it is explained.
ACTIONABLE = re.compile(r"`[^`]+`|\]\([^)]+\)")


def _reasons() -> set[str]:
    """The reason constants of conditions.py: its CamelCase strings that are no condition
    type and no status."""
    skip = set(C.TYPES) | {C.TRUE, C.FALSE, C.UNKNOWN}
    return {
        v
        for k, v in vars(C).items()
        if k.isupper() and isinstance(v, str) and re.fullmatch(r"[A-Z][A-Za-z]+", v)
        and v not in skip
    }


def _table_rows(text: str) -> dict[str, list[str]]:
    """The rows of markdown tables whose first cell is one backticked word: that word -> its
    cells (the first row wins)."""
    rows: dict[str, list[str]] = {}
    for line in text.splitlines():
        if not line.startswith("| `"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        m = re.fullmatch(r"`([A-Za-z]+)`", cells[0])
        if m and m.group(1) not in rows:
            rows[m.group(1)] = cells
    return rows


TROUBLE_ROWS = _table_rows(TROUBLESHOOTING.read_text())


def test_the_walk_finds_the_reasons() -> None:
    """The walk is not empty, and it sees reasons of every kind (claim, compile, serving,
    canary, a designed wait)."""
    assert {C.CLAIM_PENDING, C.MODEL_DOWNLOAD_FAILED, C.ENGINE_FAILED, C.CANARY_FAILED,
            C.WAITING_FOR_COMPILE_SLOT} <= _reasons()  # fmt: skip
    assert not _reasons() & set(C.TYPES)


@pytest.mark.parametrize("reason", sorted(_reasons()))
def test_every_reason_says_what_to_do(reason: str) -> None:
    row = TROUBLE_ROWS.get(reason)
    if row is None:
        # the verified promotion's reasons are explained by worked examples on their page
        promotion = PROMOTION.read_text()
        assert f"`{reason}`" in promotion or f"reason: {reason}" in promotion, (
            f"{reason} (conditions.py) has no row in {TROUBLESHOOTING.name}'s reasons table "
            f"and is not explained in {PROMOTION.name}: add what it means and what to do")
        return
    todo = row[-1]
    assert NO_ACTION.match(todo) or ACTIONABLE.search(todo), (
        f"{TROUBLESHOOTING.name}: {reason}'s 'What to do' ({todo!r}) names no field, command "
        "or setting (in backticks) and no page to read")


def test_the_reasons_table_names_no_reason_the_operator_no_longer_has() -> None:
    """The other direction: a row for a reason conditions.py dropped or renamed is a stale
    remedy users would search for in vain (the conditions table's rows are the types)."""
    text = TROUBLESHOOTING.read_text()
    reasons = _table_rows(text[text.index("## Reasons"):])
    stale = sorted(set(reasons) - _reasons())
    assert not stale, f"{TROUBLESHOOTING.name}'s reasons table has rows no reason matches: {stale}"
