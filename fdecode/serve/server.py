"""`Server`: a `ServedModel`, its engine loop, its metrics and the app, and how they start and stop.

    server = Server(model)            # fdecode.serve.model.load(folder) or a ServedModel of your own step
    server.start()                    # the engine loop thread, then warm-up in the background
    server.run(host, port)            # uvicorn in this thread; SIGTERM / Ctrl-C drains, then returns
    with Server(model).in_thread() as url: ...   # or in a background thread (tests, benches, notebooks)

Warm-up captures the step's graphs (`Step.warmup`: greedy and the general sampling plan, on compiling
backends) and sends one short request through the loop; `/health` answers 503 until it is done. On
SIGTERM uvicorn stops accepting connections and waits up to `drain_timeout` seconds for the open ones
(streams in flight finish); then the loop stops, cancelling whatever is still running.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
import threading
import time

from fdecode.params import SamplingParams
from fdecode.serve.app import build_app
from fdecode.serve.loop import EngineLoop, Job
from fdecode.serve.metrics import ServerMetrics
from fdecode.serve.model import ServedModel
from fdecode.text import encode

log = logging.getLogger("fdecode.serve")


class Server:
    def __init__(
        self,
        model: ServedModel,
        *,
        max_waiting: int = 64,
        full_status: int = 429,
        drain_timeout: float = 30.0,
        warm_graphs: bool = True,
    ) -> None:
        if full_status not in (429, 503):
            raise ValueError(f"full_status must be 429 or 503, got {full_status}")
        self.model = model
        self.metrics = ServerMetrics(model.name)
        self.loop = EngineLoop(model.step, max_waiting=max_waiting, full_status=full_status,
                               on_step=self.metrics.observe_step)  # fmt: skip
        self.drain_timeout = drain_timeout
        self.warm_graphs = warm_graphs
        self.ready = threading.Event()
        self.started = int(time.time())
        self.app = build_app(self)
        self._stopped = False

    def start(self, *, wait: bool = False) -> Server:
        """Start the engine loop and warm-up (in a thread; `wait`: until it is done)."""
        self.loop.start()
        warm = threading.Thread(target=self.warm_up, name="fdecode-warmup", daemon=True)
        warm.start()
        if wait:
            warm.join()
        return self

    def warm_up(self) -> None:
        step = self.model.step
        if self.warm_graphs and step.backend != "eager":
            step.warmup()  # before the loop runs a step: the loop thread is idle until a request comes
        done = threading.Event()
        ended = lambda item: item[0] == "error" or (item[0] == "event" and item[1].finished)
        params = SamplingParams(temperature=0.0, max_new_tokens=2, ignore_eos=True)
        job = Job(encode(self.model.tokenizer, "Hello"), params, lambda item: done.set() if ended(item) else None)
        self.loop.submit(job)
        done.wait()
        self.ready.set()
        log.info("fdecode serve: %s ready", self.model.name)

    def shutdown(self) -> None:
        """Stop admitting, let what is in flight finish (up to drain_timeout), stop the loop. Idempotent."""
        if not self._stopped:
            self._stopped = True
            self.loop.stop(self.drain_timeout)

    def run(self, host: str = "127.0.0.1", port: int = 8000, *, log_level: str = "info") -> None:
        """Serve until SIGTERM / SIGINT (uvicorn's handlers), then drain and return."""
        import uvicorn

        config = uvicorn.Config(self.app, host=host, port=port, log_level=log_level,
                                timeout_graceful_shutdown=self.drain_timeout)  # fmt: skip
        if not self.loop.running:
            self.start()
        # uvicorn handles SIGTERM (stop listening, drain) and then raises it again once it is done: the
        # handler installed here takes that second one, so a drained server exits with status 0.
        previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
        try:
            uvicorn.Server(config).run()
        finally:
            signal.signal(signal.SIGTERM, previous)
            self.shutdown()

    @contextlib.contextmanager
    def in_thread(self, host: str = "127.0.0.1", port: int | None = None, *, timeout: float = 300.0):
        """Serve from a background thread until the block ends; yields the base URL once /health says
        ready. port None: a free one."""
        import httpx
        import uvicorn

        if port is None:
            with socket.socket() as s:
                s.bind((host, 0))
                port = s.getsockname()[1]
        config = uvicorn.Config(self.app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=5)
        web = uvicorn.Server(config)
        if not self.loop.running:
            self.start()
        thread = threading.Thread(target=web.run, name="uvicorn", daemon=True)
        thread.start()
        url = f"http://{host}:{port}"
        deadline = time.monotonic() + timeout
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or not thread.is_alive():
                web.should_exit = True
                raise TimeoutError(f"the server at {url} was not ready after {timeout} s")
            time.sleep(0.05)
        try:
            yield url
        finally:
            web.should_exit = True
            thread.join(timeout=30)
            self.shutdown()

    def __repr__(self) -> str:
        return f"Server({self.model!r}, ready={self.ready.is_set()}, {self.loop!r})"
