"""The Spyre engine: precompile graphs for a shape; serve them with vLLM behind a drain-aware front.

``spyre_engine.settings`` and ``spyre_engine.summary`` import neither vLLM nor torch.
"""

from importlib import metadata as _metadata

# The version lives in pyproject.toml only (tests/unit/test_version.py); the installed
# distribution carries it.
try:
    __version__ = _metadata.version("spyre-model-operator")
except _metadata.PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"
