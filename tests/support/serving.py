"""A server on 127.0.0.1 inside the test process: uvicorn in a thread, on a free port (tests/test_serve*.py,
bench/serve_load.py)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running(server, *, timeout: float = 120.0):
    """Serve `server` (a `fdecode.serve.Server`, not started) until the block ends; yields its base URL once
    /health says ready."""
    import uvicorn

    port = free_port()
    config = uvicorn.Config(server.app, host="127.0.0.1", port=port, log_level="warning", timeout_graceful_shutdown=5)
    web = uvicorn.Server(config)
    server.start()
    thread = threading.Thread(target=web.run, name="uvicorn", daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                break
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"the server at {url} was not ready after {timeout} s")
        time.sleep(0.05)
    try:
        yield url
    finally:
        web.should_exit = True
        thread.join(timeout=30)
        server.shutdown()
