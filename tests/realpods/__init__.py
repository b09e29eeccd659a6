"""Helpers for real pods on the real node: images, the tiny model on a PVC, the chart, requests.

`support` holds everything (no pytest fixtures, no conftest), so `make demo`, the integration
tests and the contract tests share one implementation.
"""
