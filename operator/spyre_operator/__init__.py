"""spyre-model-operator: serve LLMs on IBM Spyre accelerators with vLLM."""

GROUP = "serving.spyre.dev"
VERSION = "v1alpha1"
KIND = "SpyreModel"
PLURAL = "spyremodels"
FIELD_MANAGER = "spyre-model-operator"

__version__ = "0.1.0"
