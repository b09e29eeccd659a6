"""The operator works on the lowest versions pyproject.toml allows (issue "Installable from a
release", item 4): its dependencies resolved with ``uv pip compile --resolution lowest-direct``
(each declared dependency at its lowest allowed version, what those need at their newest),
installed into a scratch venv of this interpreter with the project (``--no-deps``), then every
module imported, ``spyre-operator crd`` compared with the committed CRD, and the operator's unit
and golden tests run there. A lower bound that is too low fails here: lightkube 1.0.0 (it
deep-copies the transport it is given, the operator's counting one fails), lightkube-models
before 1.33 (``to_dict()`` leaves out apiVersion and kind), pydantic before 2.11 (another CRD
schema) did.

Not the engine extra (vLLM and torch: gigabytes; the engine image pins those, see
engine/upstream-constraints.txt). The test tools (the ``test`` extra) come at the versions of
requirements.lock: they run the tests, they are not what is tested.

Needs PyPI or uv's cache (``~/.cache/uv``); without either it fails, naming uv's error.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from .test_lock import LOCK, parse_lock

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
CRD = ROOT / "crds" / "serving.spyre.dev_spyremodels.yaml"
#: Unit tests that are not the operator's: they need the engine extra (vLLM, the plugin) or the
#: locked environment itself, or they run the CI runner's own machinery for minutes.
NOT_THE_OPERATORS = (
    "test_base_compat.py", "test_dependencies.py", "test_lock.py", "test_plugin_threads.py",
    "test_spyre_pins.py", "test_supported_shapes.py", "test_containerfile.py",
    "test_streams.py", "test_watchdog.py", "test_shutdown_budget.py", "test_engine_canary.py",
    "test_output_check_args.py", "test_contract.py",
    # imports jsonschema, which the test extra does not declare (vLLM's tree brings it)
    "test_scaletozero.py",
)  # fmt: skip
_IMPORT_ALL = """
import importlib, pkgutil, spyre_operator
names = [m.name for m in pkgutil.walk_packages(spyre_operator.__path__, "spyre_operator.")]
for name in names:
    importlib.import_module(name)
print(len(names))
"""


def _uv() -> str:
    here = Path(sys.executable).parent / "uv"
    found = str(here) if here.exists() else shutil.which("uv")
    assert found, "uv is neither next to this interpreter nor on PATH (make install)"
    return found


def _run(argv: list[str | Path], **kw: object) -> subprocess.CompletedProcess[str]:
    r = subprocess.run([str(a) for a in argv], capture_output=True, text=True, **kw)  # type: ignore[call-overload]
    assert r.returncode == 0, f"{' '.join(map(str, argv))}: exit {r.returncode}\n{r.stderr}"
    return r  # type: ignore[no-any-return]


def _pins(text: str) -> dict[str, str]:
    return {canonicalize_name(n): v for n, v in (
        line.split(" ", 1)[0].split("==", 1) for line in text.splitlines() if "==" in line
        and not line.startswith((" ", "#")))}  # fmt: skip


class Lowest:
    def __init__(self, venv: Path, pins: dict[str, str], direct: list[str]) -> None:
        self.venv, self.pins, self.direct = venv, pins, direct
        self.python = venv / "bin" / "python"


@pytest.fixture(scope="module")
def lowest(tmp_path_factory: pytest.TempPathFactory) -> Lowest:
    tmp = tmp_path_factory.mktemp("lowest")
    uv = _uv()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    direct = [canonicalize_name(Requirement(r).name) for r in project["dependencies"]]
    # the test tools at their locked versions (constraints), so only the operator's
    # dependencies are at their lowest
    locked, _ = parse_lock(LOCK.read_text())
    tools = [canonicalize_name(Requirement(r).name) for r in project["optional-dependencies"]
             ["test"]]  # fmt: skip
    (tmp / "tools.txt").write_text("".join(f"{n}=={locked[n]}\n" for n in tools))
    start = time.monotonic()
    _run([uv, "pip", "compile", ROOT / "pyproject.toml", "--extra", "test",
          "-c", tmp / "tools.txt", "--resolution", "lowest-direct", "--python", sys.executable,
          "--no-header", "--quiet", "-o", tmp / "lowest.txt"])  # fmt: skip
    pins = _pins((tmp / "lowest.txt").read_text())
    venv = tmp / "venv"
    _run([uv, "venv", "--quiet", "--python", sys.executable, venv])
    _run([uv, "pip", "install", "--quiet", "--python", venv / "bin" / "python",
          "-r", tmp / "lowest.txt"])  # fmt: skip
    _run([uv, "pip", "install", "--quiet", "--python", venv / "bin" / "python", "--no-deps",
          "-e", ROOT])  # fmt: skip
    print(f"\nlowest allowed, resolved and installed in {time.monotonic() - start:.0f}s: "
          + ", ".join(f"{n}=={pins[n]}" for n in direct))  # fmt: skip
    return Lowest(venv, pins, direct)


def test_the_declared_dependencies_are_at_their_lowest(lowest: Lowest) -> None:
    """What is installed is the lowest-direct resolution, the test tools changed none of it;
    and each pin is within its declared range (the lowest one allowed)."""
    frozen = _pins(_run([_uv(), "pip", "freeze", "--python", lowest.python]).stdout)
    for name in lowest.direct:
        assert frozen[name] == lowest.pins[name], name
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for req in map(Requirement, project["dependencies"]):
        assert req.specifier.contains(frozen[canonicalize_name(req.name)]), req


def test_every_operator_module_imports(lowest: Lowest) -> None:
    out = _run([lowest.python, "-c", _IMPORT_ALL], cwd=lowest.venv)
    assert int(out.stdout) > 30


def test_the_cli_renders_the_committed_crd(lowest: Lowest) -> None:
    out = _run([lowest.venv / "bin" / "spyre-operator", "crd"], cwd=lowest.venv)
    assert out.stdout == CRD.read_text(), (
        "on the lowest allowed versions `spyre-operator crd` renders another CRD: raise the "
        "bound whose version renders it differently")


def test_the_operators_unit_and_golden_tests_pass(lowest: Lowest) -> None:
    ignore = [f"--ignore=tests/unit/{name}" for name in NOT_THE_OPERATORS]
    r = subprocess.run(
        [str(lowest.python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow",
         "tests/unit", "tests/golden", *ignore],
        cwd=ROOT, capture_output=True, text=True)  # fmt: skip
    lines = r.stdout.splitlines()
    failed = [line for line in lines if line.startswith(("FAILED", "ERROR"))] or lines[-40:]
    summary = "\n".join([*failed, *lines[-1:]])
    assert r.returncode == 0, f"on the lowest allowed versions:\n{summary}\n{r.stderr[-2000:]}"
