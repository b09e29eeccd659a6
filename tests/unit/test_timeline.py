"""tests/contract/realpods.py ``Timeline.shared``: the Steadys on one namespace (several at once
in the autoscaling tests) share one set of ``kubectl get -w`` watches, stopped with the last
user; another namespace gets its own. kubectl is replaced by a sleeping process here."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.contract import realpods


def test_one_namespace_one_set_of_watches_stopped_by_its_last_user(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    started: list[subprocess.Popen[str]] = []
    popen = subprocess.Popen

    def watch(argv: list[str], **kw: Any) -> subprocess.Popen[str]:
        proc = popen(["sleep", "60"], stdout=subprocess.PIPE, text=True)
        started.append(proc)
        return proc

    monkeypatch.setattr(realpods.subprocess, "Popen", watch)
    cp: Any = type("CP", (), {"kubeconfig": Path("/k"), "bin_dir": Path("/bin")})()
    kinds = len(realpods.Timeline.KINDS)
    try:
        a, b = realpods.Timeline.shared(cp, "ns"), realpods.Timeline.shared(cp, "ns")
        other = realpods.Timeline.shared(cp, "other")
        assert a is b and other is not a and len(started) == 2 * kinds
        a.stop()
        assert all(p.poll() is None for p in started), "stopped while a user was left"
        b.stop()
        assert all(p.poll() is not None for p in started[:kinds])
        assert all(p.poll() is None for p in started[kinds:]), "another namespace's stopped"
        other.stop()
        again = realpods.Timeline.shared(cp, "ns")
        assert again is not a and len(started) == 3 * kinds
        again.stop()
    finally:
        for p in started:
            p.kill()
            p.wait()
