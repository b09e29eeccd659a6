"""spyre-model-operator: serve LLMs on IBM Spyre accelerators with vLLM."""

from importlib import metadata as _metadata

GROUP = "serving.spyre.dev"
VERSION = "v1alpha1"
KIND = "SpyreModel"
PLURAL = "spyremodels"
FIELD_MANAGER = "spyre-model-operator"

# The version lives in pyproject.toml only (tests/unit/test_version.py); the installed
# distribution carries it.
try:
    __version__ = _metadata.version("spyre-model-operator")
except _metadata.PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"
