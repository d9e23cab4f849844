"""Prometheus metrics for the server, written as text exposition format by hand.

No `prometheus_client` dependency: the server needs counters, histograms and gauges,
rendered by `Metrics.render()` for `GET /metrics`.
"""

from __future__ import annotations

import bisect
import threading
from collections import defaultdict
from collections.abc import Callable, Sequence

__all__ = ["LATENCY_BUCKETS", "Histogram", "Metrics"]

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)


def _esc(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(pairs: Sequence[tuple[str, str]]) -> str:
    if not pairs:
        return ""
    return "{" + ",".join(f'{k}="{_esc(v)}"' for k, v in pairs) + "}"


def _num(x: float) -> str:
    return repr(float(x)) if x != int(x) else str(int(x))


class Histogram:
    """A cumulative histogram with fixed upper bounds.

    Args:
        buckets: Upper bounds, ascending; `+Inf` is implicit.
    """

    def __init__(self, buckets: Sequence[float]):
        self.bounds = tuple(buckets)
        self.counts = [0] * (len(self.bounds) + 1)
        self.total = 0.0
        self.n = 0

    def observe(self, value: float) -> None:
        """Adds one observation."""
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value
        self.n += 1

    def lines(self, name: str, labels: Sequence[tuple[str, str]]) -> list[str]:
        """Exposition lines: `_bucket` per bound, `_sum` and `_count`."""
        out = []
        cum = 0
        for bound, c in zip((*self.bounds, float("inf")), self.counts):
            cum += c
            le = "+Inf" if bound == float("inf") else _num(bound)
            out.append(f"{name}_bucket{_labels([*labels, ('le', le)])} {cum}")
        out.append(f"{name}_sum{_labels(labels)} {self.total!r}")
        out.append(f"{name}_count{_labels(labels)} {self.n}")
        return out


class Metrics:
    """Thread-safe server metrics.

    Args:
        queue_depth: Called at render time for the current queue depth.
    """

    def __init__(self, queue_depth: Callable[[], int] | None = None):
        self._lock = threading.Lock()
        self._queue_depth = queue_depth or (lambda: 0)
        self.requests: dict[tuple[str, str], int] = defaultdict(int)
        self.latency: dict[str, Histogram] = {}
        self.batch_size = Histogram(BATCH_BUCKETS)
        self.batch_seconds = Histogram(LATENCY_BUCKETS)
        self.queue_wait = Histogram(LATENCY_BUCKETS)
        self.cancelled = 0
        self.rejected = 0
        self.in_flight = 0

    def request(self, endpoint: str, status: int, seconds: float) -> None:
        """Records one finished HTTP request."""
        with self._lock:
            self.requests[(endpoint, str(status))] += 1
            h = self.latency.get(endpoint)
            if h is None:
                h = self.latency[endpoint] = Histogram(LATENCY_BUCKETS)
            h.observe(seconds)

    def batch(self, size: int, seconds: float, waits: Sequence[float]) -> None:
        """Records one model batch: its size, run time and each job's queue wait."""
        with self._lock:
            self.batch_size.observe(size)
            self.batch_seconds.observe(seconds)
            for w in waits:
                self.queue_wait.observe(w)

    def cancel(self, n: int = 1) -> None:
        """Counts queued jobs dropped because their client went away."""
        with self._lock:
            self.cancelled += n

    def reject(self) -> None:
        """Counts a request refused because the queue was full."""
        with self._lock:
            self.rejected += 1

    def request_count(self, endpoint: str, status: int) -> int:
        """Requests recorded for `endpoint` with `status`."""
        with self._lock:
            return self.requests.get((endpoint, str(status)), 0)

    def render(self) -> str:
        """The Prometheus text exposition (version 0.0.4)."""
        with self._lock:
            lines = [
                "# HELP pcd_requests_total HTTP requests by endpoint and status code.",
                "# TYPE pcd_requests_total counter",
            ]
            for (ep, st), n in sorted(self.requests.items()):
                lines.append(f"pcd_requests_total{_labels([('endpoint', ep), ('status', st)])} {n}")
            lines += [
                "# HELP pcd_request_duration_seconds HTTP request latency by endpoint.",
                "# TYPE pcd_request_duration_seconds histogram",
            ]
            for ep, h in sorted(self.latency.items()):
                lines += h.lines("pcd_request_duration_seconds", [("endpoint", ep)])
            lines += [
                "# HELP pcd_queue_depth Decision requests waiting for the model.",
                "# TYPE pcd_queue_depth gauge",
                f"pcd_queue_depth {self._queue_depth()}",
                "# HELP pcd_batch_size Requests scored together in one model batch.",
                "# TYPE pcd_batch_size histogram",
                *self.batch_size.lines("pcd_batch_size", []),
                "# HELP pcd_batch_duration_seconds Model time per batch.",
                "# TYPE pcd_batch_duration_seconds histogram",
                *self.batch_seconds.lines("pcd_batch_duration_seconds", []),
                "# HELP pcd_queue_wait_seconds Time a request waited in the queue.",
                "# TYPE pcd_queue_wait_seconds histogram",
                *self.queue_wait.lines("pcd_queue_wait_seconds", []),
                "# HELP pcd_cancelled_total Queued requests dropped because the client left.",
                "# TYPE pcd_cancelled_total counter",
                f"pcd_cancelled_total {self.cancelled}",
                "# HELP pcd_rejected_total Requests refused with 429 because the queue was full.",
                "# TYPE pcd_rejected_total counter",
                f"pcd_rejected_total {self.rejected}",
            ]
        return "\n".join(lines) + "\n"
