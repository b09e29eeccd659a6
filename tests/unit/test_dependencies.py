"""Every third-party package the code imports is declared in pyproject.toml (issue 29): the
operator's in ``dependencies``, the engine's there or in the ``engine`` extra. An undeclared
import works only while another package happens to pull it in (lightkube 1.x's httpx2 once
stood behind a ``lightkube>=0.17`` that resolves to a version without it)."""

from __future__ import annotations

import ast
import importlib.metadata as md
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OWN = {"spyre_operator", "spyre_engine", "spyre_contract"}


def _imports(package_dir: Path) -> dict[str, str]:
    """Top-level modules imported by absolute imports under ``package_dir`` -> a file."""
    out: dict[str, str] = {}
    for f in sorted(package_dir.rglob("*.py")):
        for n in ast.walk(ast.parse(f.read_text())):
            names = ([a.name for a in n.names] if isinstance(n, ast.Import)
                     else [n.module] if isinstance(n, ast.ImportFrom) and n.level == 0
                     and n.module else [])
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in OWN:
                    out.setdefault(top, str(f.relative_to(ROOT)))
    return out


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[\s<>=!~;\[(]", r, maxsplit=1)[0].lower().replace("_", "-")
            for r in requirements}


def _undeclared(package_dir: Path, declared: set[str]) -> list[str]:
    dists = md.packages_distributions()
    missing = []
    for module, where in _imports(package_dir).items():
        provided = {d.lower().replace("_", "-") for d in dists.get(module, [])}
        assert provided, f"{module} (imported in {where}) is not installed"
        if not provided & declared:
            missing.append(f"{module} ({where}; from {', '.join(sorted(provided))})")
    return missing


def test_every_import_is_declared() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = _names(project["dependencies"])
    engine = core | _names(project["optional-dependencies"]["engine"])
    assert not _undeclared(ROOT / "operator" / "spyre_operator", core)
    assert not _undeclared(ROOT / "engine" / "spyre_engine", engine)


def test_lower_bounds_are_installable_together_with_the_code() -> None:
    """The lower bounds say what the code needs: lightkube 1.x (httpx2)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lightkube = next(r for r in project["dependencies"] if r.startswith("lightkube>"))
    assert lightkube.startswith("lightkube>=1."), lightkube
