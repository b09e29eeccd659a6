"""The operator's ``--log-format json``: one JSON object per line, with kopf's object."""

from __future__ import annotations

import io
import json
import logging

import pytest
from spyre_operator.cli import JsonFormatter, configure_logging, main


def test_json_log_lines() -> None:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter())
    log = logging.getLogger("test.json")
    log.addHandler(handler)
    log.propagate = False
    log.setLevel(logging.INFO)
    try:
        log.warning("reconcile %s/%s failed", "ns", "m")
        # kopf's per-object logger (kopf.ObjectLogger) passes the object's reference like this
        ref = {"apiVersion": "serving.spyre.dev/v1alpha1", "kind": "SpyreModel",
               "name": "m", "uid": "u1", "namespace": "ns"}
        log.info("Handler succeeded", extra={"k8s_ref": ref, "k8s_skip": False,
                                             "settings": object()})
        try:
            raise ValueError("bad")
        except ValueError:
            log.exception("oops")
    finally:
        log.removeHandler(handler)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert len(lines) == 3
    first, second, third = lines
    assert first["level"] == "WARNING" and first["logger"] == "test.json"
    assert first["message"] == "reconcile ns/m failed"
    assert first["time"].endswith("Z") and "T" in first["time"]
    assert set(first) == {"time", "level", "logger", "message"}
    assert second["object"] == ref and "settings" not in second and "k8s_skip" not in second
    assert "ValueError: bad" in third["exception"]


def test_log_format_option() -> None:
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    root.handlers[:] = []
    try:
        configure_logging("info", "json")
        (handler,) = root.handlers
        assert isinstance(handler.formatter, JsonFormatter)
        root.handlers[:] = []
        configure_logging("debug", "text")
        assert not isinstance(root.handlers[0].formatter, JsonFormatter)
        assert root.level == logging.DEBUG
    finally:
        root.handlers[:], _ = saved
        root.setLevel(saved[1])
    with pytest.raises(SystemExit):
        main(["run", "--all-namespaces", "--log-format", "xml"])
