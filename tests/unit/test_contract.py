"""spyre_contract, the names the operator and the engine share (issue 49, 4): the standard
library only (it ships in the operator's image, which has no engine), no name in it that
neither side uses, every flag the operator writes one the engine's parser takes for that
command, every variable a setting's, the operator's enums and reasons the engine's own."""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

import spyre_contract as contract
from spyre_engine import settings as S
from spyre_engine.cli import build_parser
from spyre_operator.api.v1alpha1 import CompileSpec, SpyreModelSpec
from spyre_operator.decide import conditions as C

ROOT = Path(__file__).resolve().parents[2]
CONTRACT = ROOT / "engine" / "spyre_contract" / "__init__.py"
OPERATOR = ROOT / "operator" / "spyre_operator"
ENGINE = ROOT / "engine" / "spyre_engine"
#: What the operator runs of spyre-engine, and the commands' flags it writes.
COMMANDS = {contract.PRECOMPILE, contract.SERVE, contract.GC}


def _public() -> set[str]:
    """The names the contract defines (not those it imports)."""
    out: set[str] = set()
    for node in ast.parse(CONTRACT.read_text()).body:
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            out |= {t.id for t in targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.FunctionDef | ast.ClassDef):
            out.add(node.name)
    return {n for n in out if not n.startswith("_")}


def _uses(package: Path) -> set[str]:
    """The contract's names a package refers to: ``from spyre_contract import X`` and
    ``<alias>.X`` where ``import spyre_contract as <alias>``."""
    used: set[str] = set()
    for path in package.rglob("*.py"):
        tree = ast.parse(path.read_text())
        aliases = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.Import)
                   for a in n.names if a.name == "spyre_contract"}  # fmt: skip
        for n in ast.walk(tree):
            if isinstance(n, ast.ImportFrom) and n.module == "spyre_contract":
                used |= {a.name for a in n.names}
            elif isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) \
                    and n.value.id in aliases:
                used.add(n.attr)
    return used


def _flags() -> dict[str, str]:
    return {n: v for n in _public() if isinstance(v := getattr(contract, n), str)
            and v.startswith("--") and v != contract.PASSTHROUGH}  # fmt: skip


def _reasons() -> dict[str, str]:
    return {n: v for n in _public() if isinstance(v := getattr(contract, n), str)
            and re.fullmatch(r"[A-Z][a-z]+[A-Za-z]*", v)}  # fmt: skip


def _options(command: str) -> set[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return set(sub.choices[command]._option_string_actions)


def test_the_contract_imports_the_standard_library_only() -> None:
    tree = ast.parse(CONTRACT.read_text())
    tops = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
            for a in n.names} | {n.module.split(".")[0] for n in ast.walk(tree)
                                 if isinstance(n, ast.ImportFrom) and n.module}  # fmt: skip
    assert tops <= set(sys.stdlib_module_names) | {"__future__"}, tops


def test_every_name_is_used_and_by_the_side_it_is_for() -> None:
    public = _public()
    op, en = _uses(OPERATOR), _uses(ENGINE)
    assert len(public) > 50
    assert not public - op - en, f"used by neither side: {sorted(public - op - en)}"
    flags = set(_flags())
    assert not flags - op, f"flags the operator does not write: {sorted(flags - op)}"
    reasons = set(_reasons())
    assert not reasons - en, f"reasons the engine never gives: {sorted(reasons - en)}"
    # the fields of the termination line: written by the engine, read by the operator
    for name in ("COMPILE_SECONDS", "SIZE_BYTES", "MODEL_REVISION", "REASON", "MESSAGE",
                 "REMOVED", "SKIPPED", "FREED_BYTES", "TERMINATION_LOG_PATH",
                 "STARTUP_PATH", "CANARY_REPORT_PATH", "SERVED_REPORT_PATH",
                 "json_objects_last_first", "sendnn_cache_env", "PRECOMPILE", "SERVE", "GC"):
        assert name in op and name in en, name


def test_every_flag_the_operator_writes_is_the_engines() -> None:
    """Each flag is an option of a command the operator runs; each command is the engine's."""
    options = {c: _options(c) for c in COMMANDS}
    for name, value in _flags().items():
        assert any(value in o for o in options.values()), f"{name} {value}: no command takes it"
    assert contract.MODEL in options[contract.PRECOMPILE] & options[contract.SERVE]
    assert contract.KEEP in options[contract.GC] and contract.KEEP not in options[contract.SERVE]
    # how a field is a flag and a variable: the engine's parser's spelling
    assert contract.flag("max_num_batched_tokens") in options[contract.SERVE]
    assert contract.OUTPUT_VERIFIED_ENV == S.env_name("output_verified")
    assert "output_verified" in S.ServeSettings.model_fields
    assert contract.KEEP_MODELS_ENV == S.env_name("keep_models")
    assert "keep_models" in S.CacheSettings.model_fields


def test_tasks_and_backends_are_one_type_on_both_sides() -> None:
    assert S.EngineSettings.model_fields["backend"].annotation is contract.Backend
    assert S.EngineSettings.model_fields["task"].annotation is contract.Task
    assert CompileSpec.model_fields["backend"].annotation is contract.Backend
    assert SpyreModelSpec.model_fields["task"].annotation is contract.Task
    # stored as plain names (flags, JSON, the catalog compare strings)
    settings = S.ServeSettings(model="/m", artifact_dir=Path("/a"), backend="eager")
    assert type(settings.backend) is str and type(settings.task) is str
    parser = build_parser()
    args = parser.parse_args(["serve", "--backend", "inductor", "--task", "embed"])
    assert (args.backend, args.task) == ("inductor", "embed")


def test_the_operator_reads_the_engines_reasons() -> None:
    """The reasons the operator carries into conditions are ones the engine gives."""
    given = set(_reasons().values())
    # the operator's own: a canary past its deadline, or aborted by its annotation
    own = {C.CANARY_DEADLINE_EXCEEDED, C.CANARY_ABORTED}
    carried = (C.ENGINE_COMPILE_REASONS | C.ENGINE_SERVE_REASONS) - own
    assert len(carried) >= 9 and carried <= given, carried - given
    assert C.ENGINE_FAILED in given


def test_the_termination_line_is_read_from_its_end() -> None:
    text = 'log line\n{"reason": "X"}\n{not json\n[1]\n  {"path": "/a"}  \ntail'
    assert list(contract.json_objects_last_first(text)) == [{"path": "/a"}, {"reason": "X"}]
    assert list(contract.json_objects_last_first("")) == []
