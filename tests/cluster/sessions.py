"""pytest plugin: which of ``make test``'s sessions runs a test, in what order, and one real node
shared by two of them (tests/streams.py).

At collection: marker ``integration`` on every test under tests/integration/ but the image
tests (marker ``images``: buildah, no cluster; the local session runs them), marker ``node`` on
every test of a module that uses the real node or the release, and the order below.

``make test`` runs the real-node modules as two pytest sessions side by side on the same control
plane and node: most of a real-node test is waiting (a pod's start, a canary's window, KEDA's
idle period), and one session after the other was the run's critical path. Each module keeps a
namespace and an operator of its own, so two modules' models never meet; what they share is the
node. A module that changes the node for everyone says so with a module attribute
``NODE_EXCLUSIVE`` (a string: why), e.g. test_node (it takes the node down and starts it again,
counts its cards) and test_disruption (``kubectl drain`` cordons it: no other pod would be
scheduled meanwhile). The first session runs those first (:func:`late_last`) and creates the
file named by ``$SPYRE_NODE_SHARED_FILE`` once the first test of any other module starts, or
when it ends: ``make test`` starts the second session then.

Registered from ``tests/conftest.py`` (so that a session given only some real-node modules,
``make test``'s second, marks and orders them too); without the variable it signals nothing.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

SIGNAL_ENV = "SPYRE_NODE_SHARED_FILE"
#: The module attribute of a module that must have the node to itself.
ATTRIBUTE = "NODE_EXCLUSIVE"


def exclusive(item: pytest.Item) -> bool:
    """Whether ``item``'s module must have the real node to itself."""
    return bool(getattr(getattr(item, "module", None), ATTRIBUTE, None))


def signal() -> None:
    """The second session may start (idempotent)."""
    path = os.environ.get(SIGNAL_ENV)
    if path:
        with contextlib.suppress(OSError):
            Path(path).touch()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        # The image tests (marker ``images``) build and run the images with buildah, no
        # cluster: they run in the local session (tests/streams.py), off the cluster
        # session's critical path.
        if "tests/integration/" in str(item.fspath) and item.get_closest_marker("images") is None:
            item.add_marker(pytest.mark.integration)
    mark_node_modules(items)
    items[:] = late_last(items)


#: The fixtures of a test that needs the real node (or the release its pods pull).
NODE_FIXTURES = ("real_node", "released")


def mark_node_modules(items: list[pytest.Item]) -> None:
    """Marker ``node`` on every test of a module where any test uses the real node (or the
    session's release): ``make test`` runs those in the cluster session that starts the node,
    each module whole, and the others (kwok only) in a session of their own beside it, on a
    control plane of their own (tests/streams.py)."""
    modules = {item.module for item in items
               if set(NODE_FIXTURES) & set(getattr(item, "fixturenames", ()))}
    for item in items:
        if getattr(item, "module", None) in modules:
            item.add_marker(pytest.mark.node)


def late_last(items: list[pytest.Item]) -> list[pytest.Item]:
    """The modules that must have the real node to themselves (``NODE_EXCLUSIVE``: make test's
    second real-node session starts after them, below) run first. The
    modules that need what ``make test`` builds in the background (tests/streams.py), on
    CPU the earlier tests leave idle, run last, each whole and in its order: first those that
    start KEDA (they import ``KedaStack``; KEDA is built first), then those that publish a
    release (fixture ``released``: the host's images only, so they need nothing from the
    background build any more; they stay last, where they always ran)."""
    releasing = {item.module for item in items
                 if "released" in getattr(item, "fixturenames", ())}
    keda = {item.module for item in items
            if getattr(getattr(item, "module", None), "KedaStack", None) is not None} - releasing

    def rank(item: pytest.Item) -> int:
        module = getattr(item, "module", None)
        if exclusive(item):
            return -1
        return 2 if module in releasing else 1 if module in keda else 0

    return sorted(items, key=rank)  # stable: the order within each rank is kept


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    # Before the item's fixtures: the exclusive module's own fixtures were torn down with its
    # last test (the node uncordoned, the node up again).
    if not exclusive(item):
        signal()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    signal()
