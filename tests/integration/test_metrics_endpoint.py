"""The metrics endpoint's bounds (issue 32 item 11): at most MAX_CONNECTIONS served at
once, idle connections closed after the handler's timeout, scrapes still answered."""

from __future__ import annotations

import socket
import threading
import time
import urllib.request

from engine.observability.metrics import MetricsEndpoint, _BoundedServer, _QuietHandler


class _Nothing:
    def collect(self):  # noqa: ANN201
        return []


def test_idle_connections_are_bounded_and_closed_and_scrapes_go_on(monkeypatch):
    monkeypatch.setattr(_QuietHandler, "timeout", 0.3)
    ep = MetricsEndpoint(_Nothing(), "127.0.0.1", 0)
    try:
        before = threading.active_count()
        idle = [socket.create_connection(("127.0.0.1", ep.port)) for _ in range(60)]
        deadline = time.monotonic() + 5
        peak = 0
        while time.monotonic() < deadline:  # threads rise to the bound, then fall back
            peak = max(peak, threading.active_count() - before)
            if peak and threading.active_count() <= before:
                break
            time.sleep(0.02)
        assert 0 < peak <= _BoundedServer.MAX_CONNECTIONS
        assert threading.active_count() <= before
        for s in idle:
            s.close()
        assert urllib.request.urlopen(ep.url, timeout=5).status == 200
    finally:
        ep.close()
