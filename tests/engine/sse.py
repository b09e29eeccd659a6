"""Tiny helpers to talk to the engine in tests: completions, SSE streams, metric values."""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass, field

import httpx

TIMEOUT = httpx.Timeout(60.0, connect=5.0)


@dataclass
class StreamResult:
    """What a streaming client saw."""

    events: list[str] = field(default_factory=list)
    # time.monotonic() at which each event arrived, index for index with ``events``
    event_times: list[float] = field(default_factory=list)
    first_chunk: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    status: int | None = None
    error: BaseException | None = None
    ended_at: float | None = None

    @property
    def got_done(self) -> bool:
        """True if the stream ended with ``data: [DONE]``."""
        return bool(self.events) and self.events[-1] == "[DONE]"

    @property
    def error_events(self) -> list[dict[str, object]]:
        """The ``{"error": ...}`` events of the stream."""
        out = []
        for e in self.events:
            if e.startswith("{") and '"error"' in e:
                data = json.loads(e)
                if "error" in data:
                    out.append(data)
        return out

    @property
    def text_chunks(self) -> int:
        """Number of chunks that carried text. vLLM may put several tokens in one chunk when the
        reader falls behind, so this is at most the number of tokens, not equal to it."""
        return sum(1 for d in self._chunks() if d.get("choices"))

    @property
    def completion_tokens(self) -> int | None:
        """Tokens generated, from the final usage chunk (``stream_options.include_usage``)."""
        usage = [d["usage"] for d in self._chunks() if d.get("usage")]
        return int(usage[-1]["completion_tokens"]) if usage else None

    def _chunks(self) -> list[dict[str, object]]:
        return [json.loads(e) for e in self.events if e.startswith("{")]


def stream_completion(url: str, model: str, prompt: str, max_tokens: int,
                      headers: dict[str, str] | None = None) -> StreamResult:
    """Start a streaming completion in a thread; returns immediately with a live result."""
    result = StreamResult()

    def run() -> None:
        body = {
            "model": model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        try:
            with httpx.Client(timeout=httpx.Timeout(120.0, connect=5.0)) as client:
                with client.stream("POST", url + "/v1/completions", json=body,
                                   headers=headers) as resp:
                    result.status = resp.status_code
                    for line in resp.iter_lines():
                        if line.startswith("data: "):
                            result.events.append(line[6:].strip())
                            result.event_times.append(time.monotonic())
                            result.first_chunk.set()
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            result.error = exc
        finally:
            result.ended_at = time.monotonic()
            result.first_chunk.set()
            result.done.set()

    threading.Thread(target=run, daemon=True).start()
    return result


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$")


def metric_values(text: str, name: str) -> list[float]:
    """All sample values of metric ``name`` in a Prometheus text page."""
    values = []
    for line in text.splitlines():
        m = _SAMPLE.match(line.strip())
        if m and m.group(1) == name:
            values.append(float(m.group(3)))
    return values


def metric(url: str, name: str) -> float:
    """Sum of the samples of ``name`` on ``url``/metrics."""
    text = httpx.get(url + "/metrics", timeout=TIMEOUT).text
    return sum(metric_values(text, name))
