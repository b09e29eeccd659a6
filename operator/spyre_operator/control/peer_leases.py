"""What the other installs' Leases say (peers.py): read when a model carries a stale stamp of
another install, cached a few seconds per install. A cache: rebuilt from the API server by
asking again, never the only record."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

from lightkube import ApiError, AsyncClient
from lightkube.resources.coordination_v1 import Lease

from . import peers

log = logging.getLogger("spyre_operator.control.controller")

#: An answer is asked again after this long (a Lease is renewed every ~2 s, lasts 15 s).
LEASE_TTL_SECONDS = 10.0


class PeerLeases:
    """``state(install)``: peers.LEASE_* from a cached answer, or None while the first one is
    being asked (``background`` runs the request; ``on_answer`` is called once it is in)."""

    def __init__(
        self,
        client: AsyncClient | None,
        background: Callable[[Coroutine[Any, Any, None]], None],
        on_answer: Callable[[str], None] = lambda install: None,
        ttl: float = LEASE_TTL_SECONDS,
    ) -> None:
        self.client, self.background, self.on_answer, self.ttl = client, background, on_answer, ttl
        self._answers: dict[str, tuple[str, float]] = {}
        self._asking: set[str] = set()
        self._forbidden_said = False

    def state(self, install: str) -> str | None:
        answer = self._answers.get(install)
        if answer is not None and time.monotonic() - answer[1] < self.ttl:
            return answer[0]
        if self.client is None or peers.lease_of(install) is None:
            return peers.LEASE_UNKNOWN
        if install not in self._asking:
            self._asking.add(install)
            self.background(self._ask(install))
        return answer[0] if answer is not None else None  # the older answer while asking

    async def _ask(self, install: str) -> None:
        where = peers.lease_of(install)
        assert where is not None and self.client is not None
        ns, name = where
        try:
            lease = await self.client.get(Lease, name, namespace=ns)
            state = peers.lease_state(lease.to_dict(), time.time())
        except ApiError as e:
            if e.status.code == 404:
                state = peers.LEASE_GONE
            else:
                state = peers.LEASE_UNKNOWN
                if e.status.code == 403 and not self._forbidden_said:
                    self._forbidden_said = True
                    log.warning("may not read Lease %s/%s of another install (%s): a model it "
                                "stamped is taken over only %.0f min after its last write",
                                ns, name, e.status.message,
                                peers.TAKEOVER_UNKNOWN_SECONDS / 60)
        except Exception as e:  # noqa: BLE001 - an unreachable API server: ask again later
            log.warning("reading Lease %s/%s of another install failed: %s", ns, name, e)
            state = peers.LEASE_UNKNOWN
        finally:
            self._asking.discard(install)
        self._answers[install] = (state, time.monotonic())
        self.on_answer(install)
