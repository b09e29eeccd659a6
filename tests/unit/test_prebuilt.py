"""Issue 43: what a module needs built (KEDA, prometheus-adapter) is waited for before its test's
timeout starts (tests/cluster/prebuilt.py), and the four-architecture release runs once per
change of its inputs (tests/images/build.py ``platforms_key``), not in ``make test``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.images import build

ROOT = Path(__file__).resolve().parents[2]

#: A toy session: its "KEDA build" takes 4 s once (the build script's lock, then a cache), and
#: the module's fixture calls it as tests/cluster/keda.py's KedaStack.up does, under a test
#: timeout of 2 s. Only a wait outside the timeout lets it pass.
CONFTEST = """
import time
import tests.cluster.keda as keda

pytest_plugins = {plugins!r}
_built = []


def slow_build():
    if not _built:
        time.sleep(4)
        _built.append(1)
    return "bin"


keda.keda_dir = slow_build
"""
MODULE = """
import pytest
import tests.cluster.keda as keda
from tests.cluster.keda import KedaStack  # noqa: F401 - what marks a module that starts KEDA


@pytest.fixture(scope="module")
def stack():
    return keda.keda_dir()


@pytest.mark.timeout(2)
def test_uses_keda(stack):
    assert stack == "bin"
"""


def _toy(tmp_path: Path, plugins: list[str]) -> subprocess.CompletedProcess[str]:
    (tmp_path / "conftest.py").write_text(CONFTEST.format(plugins=plugins))
    (tmp_path / "test_toy.py").write_text(MODULE)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-s",
         "--rootdir", str(tmp_path), "-c", "/dev/null", str(tmp_path)],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_a_build_the_module_needs_is_waited_for_outside_its_tests_timeout(tmp_path: Path) -> None:
    r = _toy(tmp_path, ["tests.cluster.prebuilt"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "[prebuilt] waited 4s for KEDA before" in r.stdout + r.stderr, r.stdout + r.stderr


def test_without_it_the_build_counts_against_the_timeout(tmp_path: Path) -> None:
    """The control: the same toy without the plugin is stopped at its 2 s."""
    r = _toy(tmp_path, [])
    assert r.returncode != 0 and "Timeout" in r.stdout + r.stderr, r.stdout + r.stderr


def test_a_failed_build_is_left_to_the_test(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.cluster import keda, prebuilt

    def broken() -> None:
        raise subprocess.CalledProcessError(2, "keda-deps.sh")

    monkeypatch.setattr(keda, "keda_dir", broken)
    monkeypatch.setattr(prebuilt, "_done", set())

    class Item:
        nodeid = "t::x"
        module = type("M", (), {"KedaStack": object})

    lines: list[str] = []
    prebuilt.wait_for_builds(Item(), lines.append)  # type: ignore[arg-type]
    assert len(lines) == 1 and "KEDA: not ready" in lines[0] and "tries again" in lines[0], lines
    assert not prebuilt._done


def test_the_platforms_key_follows_the_release_inputs_not_the_operator_code(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    """The four-architecture test runs again when what decides it changes (the Containerfile,
    pyproject.toml's dependencies, a base), not on every edit of the operator's Python."""
    for rel in [*build.PLATFORM_INPUTS, "operator/spyre_operator/__init__.py"]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes((ROOT / rel).read_bytes())
    monkeypatch.setattr(build, "ROOT", tmp_path)
    key = build.platforms_key()
    assert key == build.platforms_key()
    (tmp_path / "operator/spyre_operator/__init__.py").write_text("# an edit\n")
    assert build.platforms_key() == key
    (tmp_path / "operator/Containerfile").write_text(
        (ROOT / "operator/Containerfile").read_text() + "\n# an edit\n")
    assert build.platforms_key() != key
    original = (ROOT / "operator/Containerfile").read_bytes()
    (tmp_path / "operator/Containerfile").write_bytes(original)
    assert build.platforms_key() == key
    monkeypatch.setitem(build.BASE_RECIPE, "include", [*build.BASE_RECIPE["include"], "x"])  # type: ignore[misc]
    assert build.platforms_key() != key


def test_make_test_publishes_the_hosts_operator_image_only() -> None:
    """The release ``make test``'s modules publish (conftest ``released``) asks release.py for
    the host's platform; the others are ``make test-platforms``'s (Makefile)."""
    import inspect

    from tests.realpods import support

    default = inspect.signature(support.publish_release).parameters["platforms"].default
    assert default == (f"linux/{build.HOST_ARCH}",), default
    make = subprocess.run(["make", "-n", "test-platforms"], capture_output=True, text=True,
                          cwd=ROOT, timeout=60)
    assert "SPYRE_RELEASE_PLATFORMS" in make.stdout and "-m platforms" in make.stdout, make.stdout


@pytest.mark.parametrize(("machine", "arch"), [
    ("x86_64", "amd64"), ("aarch64", "arm64"), ("ppc64le", "ppc64le"), ("s390x", "s390x"),
    ("S390X", "s390x"), ("riscv64", "riscv64"),
])  # fmt: skip
def test_the_host_is_whatever_machine_the_release_runs_on(machine: str, arch: str) -> None:
    """Issue 46, 1: no host-architecture assumption: the host's platform is built natively
    and every other released one under qemu, from an x86, Z, Power or Arm host alike."""
    assert build.host_arch(machine) == arch
    assert build.HOST_ARCH == build.host_arch()
    if arch in build.OPERATOR_PLATFORMS:
        assert set(build.OPERATOR_PLATFORMS) - {arch} <= build.QEMU_ARCH.keys()
