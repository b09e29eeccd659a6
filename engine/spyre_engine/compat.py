"""Which sendnn-inference and vLLM this spyre-engine runs on, and the check that refuses others.

A site may layer spyre-engine onto its own vLLM-Spyre image (``engine/Containerfile.layer``),
for any architecture Spyre runs on. That image brings its own vLLM and sendnn-inference;
``precompile`` and ``serve`` refuse, before anything heavy, one whose versions this
spyre-engine does not support, naming what it found and what it needs (reason
``UnsupportedBase``). ``spyre-engine check-base`` (and ``python -m spyre_engine.compat``, which
the layer's build runs from the source tree before installing anything) prints the same.

The standard library only at import time (``packaging`` is imported when versions are
compared): the check must be able to say "not installed" on a base that has nothing.
"""

from __future__ import annotations

import logging
import os
import sys
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import TextIO

from spyre_engine import __version__

log = logging.getLogger(__name__)

#: What this spyre-engine supports, as version specifiers per distribution: sendnn-inference as
#: the ``engine`` extra of pyproject.toml pins it, vLLM as that sendnn-inference itself declares
#: (its ``Requires-Dist: vllm``). pyproject.toml is not in the image, hence this copy;
#: tests/unit/test_base_compat.py fails when it drifts from either source.
SUPPORTED: dict[str, str] = {
    "sendnn-inference": "==2.6.3",
    "vllm": ">=0.26.0,<0.28.1",
}

#: ``1``: ``precompile`` and ``serve`` start on an unsupported base anyway (logged as an error).
#: Unsupported: for trying a base out, never for production.
SKIP_ENV = "SPYRE_ENGINE_SKIP_BASE_CHECK"


def engine_version() -> str:
    """This spyre-engine's version. Run from a source tree (the layer's build checks before it
    installs anything; the base may hold an older spyre-engine whose metadata would answer),
    the tree's pyproject.toml; installed, the distribution's metadata."""
    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    try:
        project = tomllib.loads(pyproject.read_text())["project"]
        if project["name"] == "spyre-model-operator":
            return str(project["version"])
    except (OSError, KeyError, TypeError, ValueError):
        pass
    return __version__


@dataclass(frozen=True)
class BaseCheck:
    """The versions a Python environment has of :data:`SUPPORTED`, and the verdict."""

    #: Distribution -> installed version, None when it is not installed.
    found: Mapping[str, str | None]
    #: The interpreter that was checked (``sys.executable``).
    python: str
    #: One entry per distribution that is missing or outside its range.
    problems: tuple[str, ...]
    supported: Mapping[str, str]

    @property
    def ok(self) -> bool:
        return not self.problems

    def _list(self, versions: Mapping[str, str | None]) -> str:
        parts = [f"{name} {versions[name] or 'not installed'}" for name in self.supported]
        return ", ".join(parts[:-1]) + " and " + parts[-1] if len(parts) > 1 else parts[0]

    @property
    def message(self) -> str:
        """One line: what this spyre-engine supports, what the image has, what is wrong."""
        needs, has, py = self._list(self.supported), self._list(self.found), self.python
        text = f"spyre-engine {engine_version()} supports {needs}; this image has {has} (in {py})"
        if self.ok:
            return text
        return (
            f"{text}: {'; '.join(self.problems)}. Use a base image with the supported versions, "
            "or the spyre-engine release that supports this one"
        )


def installed_versions(names: Sequence[str] | None = None) -> dict[str, str | None]:
    """The installed version of each distribution (None when not installed), from metadata:
    nothing is imported."""
    out: dict[str, str | None] = {}
    for name in SUPPORTED if names is None else names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def _problem(name: str, version: str | None, spec: str) -> str | None:
    if version is None:
        return f"{name} is not installed"
    try:
        from packaging.specifiers import SpecifierSet
        from packaging.version import InvalidVersion, Version
    except ImportError:
        return f"cannot compare {name} {version} with {spec}: 'packaging' is not installed"
    try:
        parsed = Version(version)
    except InvalidVersion:
        return f"{name} {version} is not a PEP 440 version, so not {spec}"
    # As `pip check` decides: a pre-release or dev build counts when it is in the range.
    if not SpecifierSet(spec).contains(parsed, prereleases=True):
        return f"{name} {version} is not {spec}"
    return None


def check_base(
    found: Mapping[str, str | None] | None = None,
    *,
    python: str | None = None,
    supported: Mapping[str, str] | None = None,
) -> BaseCheck:
    """Check ``found`` (default: this environment's installed versions) against ``supported``
    (default :data:`SUPPORTED`)."""
    supported = dict(SUPPORTED if supported is None else supported)
    found = dict(installed_versions(list(supported)) if found is None else found)
    problems = tuple(
        p for name, spec in supported.items() if (p := _problem(name, found.get(name), spec))
    )
    return BaseCheck(
        found={name: found.get(name) for name in supported},
        python=python or sys.executable,
        problems=problems,
        supported=supported,
    )


def skip_requested(env: Mapping[str, str] | None = None) -> bool:
    return (os.environ if env is None else env).get(SKIP_ENV, "") == "1"


def refusal(env: Mapping[str, str] | None = None) -> str | None:
    """The message ``precompile`` and ``serve`` refuse to start with; None when the base is
    supported, or when :data:`SKIP_ENV` is ``1`` (then the problem is logged)."""
    result = check_base()
    if result.ok:
        return None
    if skip_requested(env):
        log.error("%s=1: starting on an unsupported base: %s", SKIP_ENV, result.message)
        return None
    return f"{result.message} ({SKIP_ENV}=1 starts anyway, unsupported)"


def report(out: TextIO | None = None) -> int:
    """``spyre-engine check-base``: print each supported package's found version on stdout and
    the verdict; 0 when supported (or :data:`SKIP_ENV` is ``1``), else 1 with the message on
    stderr."""
    result = check_base()
    stdout = sys.stdout if out is None else out
    for name, spec in result.supported.items():
        found = result.found[name] or "not installed"
        print(f"{name} {found} (supported: {spec})", file=stdout)
    print(f"python {result.python}", file=stdout)
    if result.ok:
        print(f"supported by spyre-engine {engine_version()}", file=stdout)
        return 0
    if skip_requested():
        print(f"unsupported, ignored ({SKIP_ENV}=1): {result.message}", file=sys.stderr)
        return 0
    print(f"unsupported base: {result.message}", file=sys.stderr)
    return 1


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m spyre_engine.compat``: the same as ``spyre-engine check-base``."""
    del argv
    return report()


if __name__ == "__main__":
    sys.exit(main())
