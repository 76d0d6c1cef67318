"""`ServerMetrics`: the Prometheus series `GET /metrics` shows (docs/serving.md, "Metrics").

Updated by the engine loop thread after every step (`observe_step`), from what the Engine already
counts (`Engine.metrics`, its depth controller's launches) and the jobs' timestamps, so it costs no
device read. Each server has its own registry, so several servers in one process (tests) never share
series. Latencies: time to first token from the request's arrival at the loop; inter-token latency is
the gap between two events of a request divided over the tokens the later one carried (a speculative
step commits several tokens at once).
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class ServerMetrics:
    def __init__(self, model: str) -> None:
        self.registry = registry = CollectorRegistry()
        label = dict(labelnames=["model"], registry=registry)
        self.running = Gauge("fdecode_requests_running", "Requests holding an Engine lane", **label)
        self.waiting = Gauge("fdecode_requests_waiting", "Requests queued for a lane", **label)
        self.kv_blocks = Gauge("fdecode_kv_blocks_used", "KV blocks held by requests (of the pool's)", **label)
        self.prompt_tokens = Counter("fdecode_prompt_tokens", "Prompt tokens of accepted requests", **label)
        self.generated = Counter("fdecode_generation_tokens", "Tokens generated", **label)
        self.finished = Counter(
            "fdecode_requests_finished", "Requests ended, by reason", ["model", "reason"], registry=registry
        )
        self.rejected = Counter(
            "fdecode_requests_rejected", "Requests refused before the Engine, by HTTP status",
            ["model", "status"], registry=registry,
        )  # fmt: skip
        self.ttft = Histogram(
            "fdecode_time_to_first_token_seconds", "Arrival to first token", buckets=LATENCY_BUCKETS, **label
        )
        self.itl = Histogram(
            "fdecode_inter_token_latency_seconds", "Gap between tokens of a request", buckets=LATENCY_BUCKETS, **label
        )
        self.e2e = Histogram(
            "fdecode_request_latency_seconds", "Arrival to last token", buckets=LATENCY_BUCKETS, **label
        )
        self.proposed = Counter("fdecode_draft_tokens_proposed", "Draft tokens verified by the target", **label)
        self.accepted = Counter("fdecode_draft_tokens_accepted", "Draft tokens accepted", **label)
        self.mean_accepted = Gauge(
            "fdecode_mean_accepted_length", "Tokens committed per verified step, over the server's life", **label
        )
        self.depth = Gauge("fdecode_draft_depth", "Draft depth the controller chose for the last step", **label)
        self.depth_steps = Counter(
            "fdecode_draft_depth_steps", "Steps launched at each draft depth", ["model", "depth"], registry=registry
        )
        self.model = model
        self._seen_engine = None
        self._totals = (0, 0)
        self._launches: dict[int, int] = {}

    def observe_step(self, engine, delivered) -> None:
        """After an Engine step: gauges, token counters and latencies of the events `delivered` to jobs."""
        m = self.model
        now = time.perf_counter()
        self.running.labels(m).set(engine.num_active)
        self.waiting.labels(m).set(engine.num_waiting)
        self.kv_blocks.labels(m).set(engine.allocator.capacity - engine.allocator.num_free)
        for job, event in delivered:
            n = len(event.new_tokens)
            if n:
                self.generated.labels(m).inc(n)
                if job.last_gap_from is None:
                    self.ttft.labels(m).observe(now - job.arrived)
                else:
                    gap = (now - job.last_gap_from) / n
                    for _ in range(n):
                        self.itl.labels(m).observe(gap)
                job.last_gap_from = now
            if event.finished:
                self.finished.labels(m, event.reason or "unknown").inc()
                self.e2e.labels(m).observe(now - job.arrived)
        self._count_drafts(engine)

    def _count_drafts(self, engine) -> None:
        m = self.model
        if engine is not self._seen_engine:  # a fresh Engine (after a failed step) counts from zero
            self._seen_engine, self._totals, self._launches = engine, (0, 0), {}
        totals = engine.metrics.totals
        proposed, accepted = totals.drafts_proposed, totals.drafts_accepted
        self.proposed.labels(m).inc(proposed - self._totals[0])
        self.accepted.labels(m).inc(accepted - self._totals[1])
        self._totals = (proposed, accepted)
        self.mean_accepted.labels(m).set(engine.metrics.mean_accepted_length)
        policy = engine.policy  # how the Engine chooses each launch's depth (`fdecode.runtime.policy`)
        self.depth.labels(m).set(engine.config.K if policy.depth is None else policy.depth)
        for depth, count in policy.launches.items():
            self.depth_steps.labels(m, str(depth)).inc(count - self._launches.get(depth, 0))
            self._launches[depth] = count

    def reject(self, status: int) -> None:
        self.rejected.labels(self.model, str(status)).inc()

    def accept(self, prompt_tokens: int) -> None:
        self.prompt_tokens.labels(self.model).inc(prompt_tokens)

    def page(self) -> bytes:
        return generate_latest(self.registry)
