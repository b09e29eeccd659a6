"""pytest plugin: wait for what a module's tests need built before their own timeout starts.

A module that starts KEDA (it imports ``KedaStack``) needs KEDA's five Go binaries, a module
that starts prometheus-adapter (``MetricsStack``) the adapter: ``make test`` builds both in the
background (tests/streams.py), on CPU nothing else wants. On a machine where that build had
not finished, the first such test waited for a Go build inside its fixture, and pytest-timeout
counted the build against the test: CI of issue 43 stopped ``test_keda.py``'s first test at its
600 s on a machine half as fast, the system healthy, KEDA still compiling.

Here the wait comes first: before pytest-timeout's wrapper starts a test's clock (this
hookwrapper is ``tryfirst``, so it is the outer one), the build the test needs is waited for
(lifted to a normal CPU weight while it is, ``background.needed``), bounded by the build's own
deadline (:data:`BUILD_DEADLINE`), and the wait is printed. A build that fails is not reported
here: the test's fixture calls the same function and fails with the build's output.

Registered from ``tests/conftest.py``.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Generator
from typing import Any

import pytest

#: How long a build may take before the wait gives up (then the test's fixture tries itself,
#: inside its timeout): KEDA cold is ~7 min alone on a 2-core machine, ~15 beside two busy test
#: sessions on one twice as slow.
BUILD_DEADLINE = 2700.0

_done: set[str] = set()


def _builds(item: pytest.Item) -> list[tuple[str, Callable[[], Any]]]:
    """(name, the function that builds or reuses it) for what ``item``'s module starts."""
    module = getattr(item, "module", None)
    out: list[tuple[str, Callable[[], Any]]] = []
    if getattr(module, "KedaStack", None) is not None:
        from tests.cluster.keda import keda_dir

        out.append(("KEDA", keda_dir))
    if getattr(module, "MetricsStack", None) is not None:
        from tests.cluster.metrics import adapter_binary

        out.append(("prometheus-adapter", adapter_binary))
    return out


def wait_for_builds(item: pytest.Item, log: Callable[[str], None]) -> None:
    """Each build ``item`` needs, once per session; failures are left to the test."""
    for name, build in _builds(item):
        if name in _done:
            continue
        t0 = time.monotonic()
        try:
            _bounded(build, BUILD_DEADLINE)
        except Exception as e:  # the fixture calls it again and reports it
            log(f"[prebuilt] {name}: not ready after {time.monotonic() - t0:.0f}s ({e!r}); "
                "the test's fixture tries again")
            continue
        _done.add(name)
        took = time.monotonic() - t0
        if took >= 1:
            log(f"[prebuilt] waited {took:.0f}s for {name} before {item.nodeid} (outside its "
                "timeout)")


def _bounded(fn: Callable[[], Any], seconds: float) -> None:
    """``fn()`` in a thread, given up after ``seconds`` (the build itself goes on: the script
    holds its lock, and the fixture's own call waits for it)."""
    box: dict[str, BaseException] = {}

    def run() -> None:
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            box["e"] = e

    t = threading.Thread(target=run, daemon=True, name="prebuilt")
    t.start()
    t.join(seconds)
    if t.is_alive():
        raise TimeoutError(f"still building after {seconds:.0f}s")
    if "e" in box:
        raise box["e"]


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None
                            ) -> Generator[None, None, None]:
    reporter = item.config.pluginmanager.get_plugin("terminalreporter")

    def log(msg: str) -> None:  # the terminal, not a test's captured output
        if reporter is not None:
            reporter.write_line(msg)
        else:
            print(msg, file=sys.stderr, flush=True)

    wait_for_builds(item, log)
    yield
