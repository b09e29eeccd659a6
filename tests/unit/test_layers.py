"""The operator's layers (issue 31, Structure; issue 49, 6: a folder per floor).

The package root holds the entry only (``__init__``, ``cli``: the program, ``handlers``: the
kopf layer); everything else lives in a floor:

- ``api/``: the SpyreModel API models;
- ``desired/``: pure builders, a spec in and typed Kubernetes objects out;
- ``decide/``: the pure decisions, with one face (``spyre_operator.decide``);
- ``gen/``: the generators of the CRD and the docs;
- ``kube/``: the API server's writer (``apply``);
- ``runtime/``: what the operator serves (``/metrics``, the cold-start responder);
- ``control/``: the controller and its collaborators.

The pure floors (``api/``, ``desired/``, ``decide/``) import nothing from ``control/``,
``kube/``, ``runtime/``, ``gen/`` or the entry, nor kopf, an HTTP server or a client: a decision
then cannot reach a client or a cache."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "operator" / "spyre_operator"
NAME = PKG.name
#: The modules at the package root: the entry.
ENTRY = {"__init__.py", "cli.py", "handlers.py"}
FLOORS = {"api", "desired", "decide", "gen", "kube", "runtime", "control"}
PURE_FLOORS = {"api", "desired", "decide"}
#: What a pure floor may not import: the impure floors and the entry modules.
IMPURE = {"control", "kube", "runtime", "gen", "cli", "handlers"}
#: Third-party modules a pure floor may not import: kopf's runtime, servers, HTTP clients and
#: lightkube's client (its models, resources and generic resources are plain data).
IMPURE_THIRD_PARTY = ("kopf", "aiohttp", "httpx", "httpx2", "prometheus_client",
                      "lightkube.core", "lightkube.config")


def _module_of(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(dotted: str) -> bool:
    rel = dotted.split(".")[1:]
    base = PKG.joinpath(*rel) if rel else PKG
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _statements(path: Path) -> list[tuple[str, list[str]]]:
    """``(source module, names)`` of every import in ``path``, relative ones resolved
    (``import a.b`` is ``("a.b", [])``)."""
    module = _module_of(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: list[tuple[str, list[str]]] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            out.append((source, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names]
    return out


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, dotted (``from ..kube import apply`` is the module
    ``spyre_operator.kube.apply``)."""
    out: set[str] = set()
    for source, names in _statements(path):
        out.add(source)
        if source.split(".")[0] == NAME:
            out |= {f"{source}.{n}" for n in names if _is_module(f"{source}.{n}")}
    return out


def _floor(dotted: str) -> str | None:
    """The floor (or entry module) of an operator module; None for the package root."""
    parts = dotted.split(".")
    return parts[1] if parts[0] == NAME and len(parts) > 1 else None


def _pure_floor_breaches(path: Path) -> list[str]:
    found = []
    for mod in sorted(_imports(path)):
        if _floor(mod) in IMPURE:
            found.append(mod)
        elif any(mod == t or mod.startswith(t + ".") for t in IMPURE_THIRD_PARTY) or \
                mod == "lightkube":
            found.append(mod)
    return found


def test_the_root_holds_the_entry_and_the_floors_only() -> None:
    """Issue 49, 6: a module goes into the floor its role belongs to, not at the root."""
    modules = {p.name for p in PKG.glob("*.py")}
    assert modules == ENTRY, f"move into a floor: {sorted(modules - ENTRY)}"
    packages = {p.name for p in PKG.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    assert packages == FLOORS
    no_init = sorted(p.relative_to(PKG).as_posix() for p in PKG.rglob("*")
                     if p.is_dir() and p.name != "__pycache__" and p.name != "data"
                     and any(p.glob("*.py")) and not (p / "__init__.py").is_file())
    assert no_init == [], f"a package without __init__.py is left out of the wheel: {no_init}"


def test_the_pure_floors_import_neither_the_control_nor_the_write_layer() -> None:
    pure = [p for f in sorted(PURE_FLOORS) for p in sorted((PKG / f).rglob("*.py"))]
    assert len(pure) > 40
    found = {p.relative_to(PKG).as_posix(): _pure_floor_breaches(p) for p in pure}
    assert {k: v for k, v in found.items() if v} == {}


def test_no_floor_imports_the_entry() -> None:
    floors = [p for f in sorted(FLOORS) for p in sorted((PKG / f).rglob("*.py"))]
    found = {p.relative_to(PKG).as_posix(): sorted(m for m in _imports(p)
                                                    if _floor(m) in {"cli", "handlers"})
             for p in floors}
    assert {k: v for k, v in found.items() if v} == {}


def test_the_check_sees_an_import_of_the_control_layer() -> None:
    bad = PKG / "decide" / "_probe_for_test.py"
    try:
        bad.write_text("from ..control.budget import Waiting\nfrom ..kube import apply\n"
                       "from ..runtime.metrics import Instruments\nimport kopf\n"
                       "from lightkube import AsyncClient\nfrom .observed import Observed\n")
        assert _pure_floor_breaches(bad) == [
            "kopf", "lightkube", f"{NAME}.control.budget", f"{NAME}.kube",
            f"{NAME}.kube.apply", f"{NAME}.runtime.metrics"]
    finally:
        bad.unlink()


def _face() -> set[str]:
    tree = ast.parse((PKG / "decide" / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return set(ast.literal_eval(node.value))
    raise AssertionError("decide/__init__.py has no __all__")


def test_the_decisions_have_one_face() -> None:
    """Issue 49, 3 and 6: outside decide/, the operator imports the decisions from
    ``spyre_operator.decide`` (its ``__init__``, which re-exports them), and only what it
    lists in ``__all__``; never one of its modules."""
    face = _face()
    outside = [p for p in sorted(PKG.rglob("*.py")) if p.relative_to(PKG).parts[0] != "decide"]
    assert len(outside) > 40
    found = []
    for p in outside:
        for source, names in _statements(p):
            if source.startswith(f"{NAME}.decide."):
                found.append(f"{p.relative_to(PKG).as_posix()}: {source}")
            elif source == f"{NAME}.decide":
                found += [f"{p.relative_to(PKG).as_posix()}: {source}.{n} (not in __all__)"
                          for n in names if n not in face]
    assert found == [], f"import the decisions from spyre_operator.decide: {found}"
