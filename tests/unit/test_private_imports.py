"""No module of the operator or the engine imports another module's private name (issue 49,
3): what one module uses of another is that module's public face, so a private helper can be
changed where it lives without reading the whole package. Read with ``ast``, not grepped."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = [ROOT / "operator" / "spyre_operator", ROOT / "engine" / "spyre_engine"]


def private_imports(package: Path) -> list[str]:
    """``importer: module.name`` for every ``from <module of package> import _name``."""
    out = []
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        here = list(parts if path.name == "__init__.py" else parts[:-1])
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level:
                base = here[: len(here) - (node.level - 1)]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            if source.split(".")[0] != package.name:
                continue
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    out.append(f"{'.'.join(parts)}: {source}.{alias.name}")
    return out


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.name)
def test_no_module_imports_another_modules_private_name(package: Path) -> None:
    assert private_imports(package) == []


def test_the_check_sees_a_private_import(tmp_path: Path) -> None:
    pkg = tmp_path / "spyre_operator"
    (pkg / "decide").mkdir(parents=True)
    (pkg / "decide" / "a.py").write_text("def _helper(): pass\n")
    (pkg / "decide" / "b.py").write_text("from .a import _helper\nfrom ..x import __version__\n")
    (pkg / "c.py").write_text("from spyre_operator.decide.a import _helper as h\n")
    assert private_imports(pkg) == ["spyre_operator.c: spyre_operator.decide.a._helper",
                                    "spyre_operator.decide.b: spyre_operator.decide.a._helper"]
