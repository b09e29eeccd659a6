"""The controller's work queue: a de-duplicating, prioritised queue of SpyreModel keys."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable

from .common import ModelKey


class WorkQueue:
    """A set-backed queue: a key is queued at most once and processed by one worker at a time.

    Urgent keys (a new SpyreModel, a Job that just finished) go ahead of routine
    re-reconciles: with hundreds of models the routine ones (status echoes, child status
    updates) otherwise delay the steps users wait for (apply -> Job, Job done -> Deployment).
    """

    URGENT, NORMAL = 0, 1

    def __init__(self, on_wait: Callable[[float], None] | None = None) -> None:
        self._queue: asyncio.PriorityQueue[tuple[int, int, ModelKey]] = asyncio.PriorityQueue()
        self._queued: dict[ModelKey, int] = {}  # key -> priority of its live entry
        #: key -> when it entered the queue (a more urgent re-add keeps the first time)
        self._since: dict[ModelKey, float] = {}
        #: Told how long each key waited, when a worker takes it (the metrics' histogram).
        self.on_wait = on_wait
        self._seq = itertools.count()
        self._active: set[ModelKey] = set()
        self._dirty: dict[ModelKey, int] = {}
        self._timers: dict[ModelKey, asyncio.TimerHandle] = {}

    def add(self, key: ModelKey, urgent: bool = False) -> None:
        """Queue ``key`` now (or again once its current reconcile finishes)."""
        prio = self.URGENT if urgent else self.NORMAL
        if key in self._active:
            self._dirty[key] = min(prio, self._dirty.get(key, prio))
        elif self._queued.get(key, self.NORMAL + 1) > prio:
            self._since.setdefault(key, time.monotonic())
            self._queued[key] = prio  # an earlier, less urgent entry becomes stale
            self._queue.put_nowait((prio, next(self._seq), key))

    def add_after(self, key: ModelKey, delay: float) -> None:
        """Queue ``key`` after ``delay`` seconds (an earlier pending timer wins)."""
        loop = asyncio.get_running_loop()
        existing = self._timers.get(key)
        due = loop.time() + delay
        if existing is not None and existing.when() <= due:
            return
        if existing is not None:
            existing.cancel()
        self._timers[key] = loop.call_at(due, self._fire, key)

    def _fire(self, key: ModelKey) -> None:
        self._timers.pop(key, None)
        self.add(key)

    async def get(self) -> ModelKey:
        while True:
            prio, _, key = await self._queue.get()
            if self._queued.get(key) == prio:
                break  # else a stale entry: the key was re-queued more urgently, or taken
        del self._queued[key]
        since = self._since.pop(key, None)
        if since is not None and self.on_wait is not None:
            self.on_wait(time.monotonic() - since)
        self._active.add(key)
        return key

    def done(self, key: ModelKey) -> None:
        self._active.discard(key)
        if key in self._dirty:
            self.add(key, urgent=self._dirty.pop(key) == self.URGENT)

    def __len__(self) -> int:
        return len(self._queued) + len(self._active)

