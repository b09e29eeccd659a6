"""Test helpers shared by the engine tests and the operator/engine contract tests."""
