"""``GET /metrics``: the server's Prometheus metrics (``prometheus_client``, one registry each).

- ``dsh_serve_turns_started_total``, ``dsh_serve_turns_ended_total{kind}`` (the turn-end kind),
  ``dsh_serve_turns_running``
- ``dsh_serve_steps_total``: agent steps ended
- ``dsh_serve_flush_seconds``: latency of every durability barrier (``ctx.sessions.flush``)
  the server's hosts run, the checkpoint policy's included
- ``dsh_serve_pending_approvals``: calls waiting for a decision, across stored sessions
  (recomputed at each scrape)
"""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

__all__ = ["CONTENT_TYPE", "ServerMetrics"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

#: Flush latency buckets (seconds): an fsync or a commit is milliseconds on a healthy disk.
_FLUSH_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class ServerMetrics:
    """The counters of one server process."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.turns_started = Counter(
            "dsh_serve_turns_started", "Turns started by this process", registry=self.registry
        )
        self.turns_ended = Counter(
            "dsh_serve_turns_ended",
            "Turns ended in this process, by turn-end kind",
            ["kind"],
            registry=self.registry,
        )
        self.turns_running = Gauge(
            "dsh_serve_turns_running", "Turns running in this process", registry=self.registry
        )
        self.steps = Counter("dsh_serve_steps", "Agent steps ended", registry=self.registry)
        self.flush_seconds = Histogram(
            "dsh_serve_flush_seconds",
            "Latency of the durability barrier (ctx.sessions.flush)",
            buckets=_FLUSH_BUCKETS,
            registry=self.registry,
        )
        self.logs_read = Counter(
            "dsh_serve_logs_read",
            "Stored logs read whole to summarize a session (a listing reads only changed ones)",
            registry=self.registry,
        )
        self.pending_approvals = Gauge(
            "dsh_serve_pending_approvals",
            "Tool calls waiting for an approval decision, across stored sessions",
            registry=self.registry,
        )

    def time_flushes(self, sessions: Any, after: Callable[[Any], None] | None = None) -> None:
        """Observe every ``sessions.flush`` of one host's session store (then ``after(session)``
        once the flush succeeded)."""
        flush: Callable[[Any], Awaitable[bool]] = sessions.flush
        histogram = self.flush_seconds

        @functools.wraps(flush)
        async def timed(session: Any) -> bool:
            started = time.perf_counter()
            try:
                done = await flush(session)
            finally:
                histogram.observe(time.perf_counter() - started)
            if after is not None:
                after(session)
            return done

        sessions.flush = timed

    def render(self) -> bytes:
        return bytes(generate_latest(self.registry))
