"""The Spyre engine: precompile graphs for a shape; serve them with vLLM behind a drain-aware front.

``spyre_engine.settings`` and ``spyre_engine.summary`` import neither vLLM nor torch.
"""

__version__ = "0.1.0"
