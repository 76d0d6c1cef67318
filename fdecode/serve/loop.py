"""`EngineLoop`: the one thread that owns the Engine (and so the device) (docs/serving.md, "How it runs").

HTTP handlers never touch the Engine. They `submit` a `Job` (prompt ids, unresolved SamplingParams, a
thread-safe `sink`), and `cancel` it; both go through one queue the loop thread drains before every
Engine step, so requests join and leave between steps. Each Job's sink then receives, in order:
("accepted", request_id) or ("error", message) (the request was refused: nothing else follows), then
("event", Event) per Engine event, the last one finished. Admission is bounded: at most `max_batch +
max_waiting` jobs in flight, beyond which `submit` raises a 429 (or 503) `APIError`. An exception
inside an Engine step ends the requests in flight with an error, and the loop goes on with a fresh
Engine. `stop` refuses new jobs, lets those in flight finish for up to `drain_timeout` seconds, cancels
the rest and joins the thread.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from fdecode.params import SamplingParams, request_params
from fdecode.runtime.engine import Engine, Event
from fdecode.serve.errors import APIError

log = logging.getLogger("fdecode.serve")


@dataclass(eq=False)
class Job:
    """One request on its way through the loop."""

    prompt: list[int]
    params: SamplingParams  # as the request asked; resolved (seed, stop ids) by the loop
    sink: Callable[[tuple], None]  # called from the loop thread; must not block
    arrived: float = field(default_factory=time.perf_counter)
    request_id: int | None = None  # the Engine's id, once accepted
    last_gap_from: float | None = None  # when its last tokens were delivered (`ServerMetrics`)


class EngineLoop:
    def __init__(
        self,
        step,
        *,
        max_waiting: int = 64,
        full_status: int = 429,
        on_step: Callable[[Engine, list[tuple[Job, Event]]], None] | None = None,
        idle_poll: float = 0.05,
    ) -> None:
        self.step = step
        self.engine = Engine(step)
        self.limit = step.config.max_batch + max_waiting
        self.full_status = full_status
        self.on_step = on_step
        self.idle_poll = idle_poll
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._jobs: dict[int, Job] = {}  # Engine request id -> job (loop thread only)
        self._in_flight = 0  # jobs submitted and not ended (guarded by _lock)
        self._lock = threading.Lock()
        self._draining = threading.Event()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fdecode-engine", daemon=True)
        # torch's intra-op thread count is per thread: the loop runs with the one its creator set, as the
        # library would in that thread (a fresh thread may otherwise run its ops on fewer).
        self.threads = torch.get_num_threads()
        self.steps = 0

    # ------------------------------------------------------------------ any thread

    def start(self) -> EngineLoop:
        self._thread.start()
        return self

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def submit(self, job: Job) -> Job:
        """Queue a job, or raise APIError where the loop is full or shutting down."""
        if self._draining.is_set() or self._stopped.is_set():
            raise APIError(503, "the server is shutting down", code="shutting_down")
        with self._lock:
            if self._in_flight >= self.limit:
                raise APIError(
                    self.full_status,
                    f"the server is full ({self._in_flight} requests in flight, limit {self.limit}): retry later",
                    code="queue_full",
                )
            self._in_flight += 1
        self._commands.put(("add", job))
        return job

    def cancel(self, job: Job) -> None:
        """Stop a job (a dropped client, a matched stop string); harmless once it ended."""
        self._commands.put(("cancel", job))

    def stop(self, drain_timeout: float = 30.0) -> None:
        """Refuse new jobs, let the running ones finish for up to `drain_timeout` s, cancel the rest, join."""
        self._draining.set()
        deadline = time.monotonic() + drain_timeout
        while self._in_flight and time.monotonic() < deadline and self._thread.is_alive():
            time.sleep(0.02)
        self._commands.put(("stop", None))
        self._thread.join(timeout=max(5.0, drain_timeout))

    # ------------------------------------------------------------------ the loop thread

    def _run(self) -> None:
        torch.set_num_threads(self.threads)
        try:
            while True:
                busy = self.engine.has_work()
                if not self._take_commands(block=not busy):
                    break
                if self.engine.has_work():
                    self._step()
        finally:
            self._stopped.set()
            for job in list(self._jobs.values()):
                self._end(job, ("event", Event(job.request_id, [], True, reason="cancelled")))

    def _take_commands(self, *, block: bool) -> bool:
        """Apply queued commands (waiting up to `idle_poll` s for one when idle); False on "stop"."""
        try:
            command = self._commands.get(timeout=self.idle_poll) if block else self._commands.get_nowait()
        except queue.Empty:
            return True
        while True:
            kind, job = command
            if kind == "stop":
                for running in list(self._jobs.values()):
                    self._cancel(running)
                self._deliver(self.engine.step() if self.engine.has_work() else [])
                return False
            if kind == "add":
                self._add(job)
            else:
                self._cancel(job)
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return True

    def _add(self, job: Job) -> None:
        engine, cfg = self.engine, self.step.config
        try:
            (params,) = request_params(
                1,
                cfg,
                self.step.target.config.vocab_size,
                params=job.params,
                seeds=self.step.seeds,
                labels=[None],
                per_prompt=False,
            )
            job.request_id = engine.add_resolved(job.prompt, params)
        except (ValueError, TypeError) as error:
            self._release()
            self._emit(job, ("error", str(error)))
            return
        self._jobs[job.request_id] = job
        self._emit(job, ("accepted", job.request_id))

    def _cancel(self, job: Job) -> None:
        if self._jobs.get(job.request_id) is job and job.request_id in self.engine.requests:
            self.engine.cancel(job.request_id)  # its final event comes with the next step

    def _step(self) -> None:
        try:
            events = self.engine.step()
        except Exception as error:  # one failed step must not end the server
            log.error("engine step failed; its requests end with an error:\n%s", traceback.format_exc())
            message = f"the engine failed: {type(error).__name__}: {error}"
            self.engine = Engine(self.step)  # before the jobs hear of it: a retry finds the fresh Engine
            for job in list(self._jobs.values()):
                self._end(job, ("event", Event(job.request_id, [], True, error=message, reason="error")))
            return
        self.steps += 1
        self._deliver(events)

    def _deliver(self, events: list[Event]) -> None:
        delivered = [(self._jobs[e.request_id], e) for e in events if e.request_id in self._jobs]
        if self.on_step is not None:
            self.on_step(self.engine, delivered)  # before the sinks: a client that reads its last token sees it counted
        for job, event in delivered:
            if event.finished:
                self._end(job, ("event", event))
            else:
                self._emit(job, ("event", event))

    def _end(self, job: Job, item: tuple) -> None:
        self._jobs.pop(job.request_id, None)
        self._release()
        self._emit(job, item)

    def _release(self) -> None:
        with self._lock:
            self._in_flight -= 1

    @staticmethod
    def _emit(job: Job, item: tuple) -> None:
        try:
            job.sink(item)
        except RuntimeError:  # the client's event loop is gone (server shutting down): nobody listens
            pass

    def __repr__(self) -> str:
        return f"EngineLoop({self.engine!r}, in_flight={self._in_flight}/{self.limit}, steps={self.steps})"
