"""Every shipped or documented SpyreModel is admitted by the API server (server-side dry run).

The list is ``tests.documented_models``: samples, README/GITOPS YAML blocks, the chart NOTES.
The operator's resolution of their shapes is checked in tests/unit/test_supported_shapes.py and
the plugin's own verdict in tests/engine/test_supported_configs.py.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.cluster.controlplane import ControlPlane
from tests.documented_models import documented_models

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(
    "where,doc", documented_models(), ids=lambda v: v if isinstance(v, str) else ""
)
def test_documented_spyremodel_is_admitted(
    control_plane: ControlPlane, namespace: str, crd: Any, where: str, doc: dict[str, Any]
) -> None:
    r = control_plane.kubectl(
        "apply", "-n", namespace, "--server-side", "--dry-run=server",
        "--field-manager=docs", "-f", "-", input=json.dumps(doc), check=False,
    )  # fmt: skip
    assert r.returncode == 0, f"{where}: {r.stderr}"
