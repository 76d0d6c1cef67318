"""Helpers of the server tests (tests/test_serve*.py)."""

from __future__ import annotations

import socket


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def running(server, **kwargs):
    """Serve `server` (a `fdecode.serve.Server`) in a background thread for the block; yields its URL."""
    return server.in_thread(**kwargs)
