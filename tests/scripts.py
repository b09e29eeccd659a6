"""operator/scripts/*.py as modules, for the tests: one loader, one module object per script.

operator/ is no package (importable as ``operator`` it would shadow the stdlib's), so the
scripts' folder goes on ``sys.path``, as it is when they run: release.py imports
release_signing.py and bundle.py from beside itself, and ``script("release").signing`` is
the very module ``script("release_signing")`` returns. A monkeypatch on one is seen by all.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

SCRIPTS = Path(__file__).resolve().parents[1] / "operator" / "scripts"


def script(name: str) -> ModuleType:
    """operator/scripts/``name``.py, imported once."""
    if str(SCRIPTS) not in sys.path:
        sys.path.insert(0, str(SCRIPTS))
    module = importlib.import_module(name)
    assert Path(module.__file__ or "").resolve().parent == SCRIPTS, (name, module.__file__)
    return module
