"""The operator's layers (issue 31, Structure): the pure decisions (``decide/``, ``desired/``
and ``reconcile.py``, their facade) import nothing from the control layer (the controller and
its parts, the budgets' counting, garbage collection, resync, leader election, metrics) or the
write layer (apply.py, the kopf handlers). A decision then cannot reach a client or a cache."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "operator" / "spyre_operator"
PURE = [*sorted((PKG / "decide").glob("*.py")), *sorted((PKG / "desired").glob("*.py")),
        PKG / "reconcile.py"]
#: Modules of the control and write layers (top-level names under spyre_operator).
IMPURE = {"controller", "control", "apply", "handlers", "resync", "leader",
          "metrics", "cli", "coldstart", "optional"}


def _imports(path: Path) -> set[str]:
    """Top-level spyre_operator modules ``path`` imports (relative or absolute)."""
    rel = path.relative_to(PKG).with_suffix("").parts  # e.g. ("decide", "artifact")
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(rel[: len(rel) - node.level])
                parts = base + (node.module.split(".") if node.module else [])
                if parts:
                    out.add(parts[0])
                else:  # from .. import x: x is the module
                    out |= {a.name for a in node.names}
            elif node.module and node.module.startswith("spyre_operator."):
                out.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            out |= {a.name.split(".")[1] for a in node.names
                    if a.name.startswith("spyre_operator.")}
    return out


def test_the_decisions_import_neither_the_control_nor_the_write_layer() -> None:
    assert len(PURE) > 10
    found = {p.relative_to(PKG).as_posix(): sorted(_imports(p) & IMPURE) for p in PURE}
    assert {k: v for k, v in found.items() if v} == {}


def test_the_check_sees_an_import_of_the_control_layer(tmp_path: Path) -> None:
    bad = PKG / "decide" / "_probe_for_test.py"
    try:
        bad.write_text("from ..budget import Waiting\nfrom .. import apply\n")
        assert _imports(bad) >= {"budget", "apply"}
    finally:
        bad.unlink()


def test_the_decisions_have_one_face() -> None:
    """Issue 49, 3: outside decide/, only reconcile.py (which re-exports them) imports the
    decision modules; the rest of the operator imports reconcile."""
    outside = [p for p in sorted(PKG.rglob("*.py"))
               if p.relative_to(PKG).parts[0] != "decide" and p.name != "reconcile.py"]
    found = sorted(p.relative_to(PKG).as_posix() for p in outside if "decide" in _imports(p))
    assert len(outside) > 40
    assert found == [], f"import the decisions from reconcile.py: {found}"
