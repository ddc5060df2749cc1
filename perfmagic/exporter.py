"""``perfmagic exporter``: this machine's GPUs and host as a Prometheus scrape target.

Each scrape reads NVML and the host once (no sampler thread: Prometheus sets the pace) and
answers in dcgm-exporter's names and labels (:mod:`perfmagic.render.prometheus`), with the progress
of every profiling session running on the machine (:mod:`perfmagic.registry`). It is meant
for machines without dcgm-exporter; beside it, the same series would be scraped twice.
"""

from __future__ import annotations

import socket
import sys
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from perfmagic.registry import running_sessions
from perfmagic.render.prometheus import CONTENT_TYPE, exposition
from perfmagic.server.service import open_nvml
from perfmagic.server.snapshot import HostReader, NvmlLike, ProcessCache, read_gpus, read_processes

PROCESSES_EVERY_S = 5.0
"""How long a scrape reuses the GPUs' process lists (per-process NVML queries are the slow ones)."""


class Exporter:
    """Reads the GPUs and the host into the text format, one scrape at a time."""

    def __init__(
        self,
        hostname: str | None = None,
        nvml_opener: Callable[[], tuple[NvmlLike | None, str | None]] = open_nvml,
    ) -> None:
        self.hostname = hostname or socket.gethostname()
        self._nv, self.nvml_reason = nvml_opener()
        self._static = [self._nv.static_info(i) for i in range(self._nv.device_count())] if self._nv else []
        self._host = HostReader()
        self._processes = ProcessCache(PROCESSES_EVERY_S)
        self._lock = threading.Lock()  # two scrapes at once would split the host's CPU deltas

    def metrics(self) -> str:
        with self._lock:
            nv = self._nv
            gpus = read_gpus(nv, self._static) if nv is not None else []
            host = self._host.read()
            processes = self._processes.get(lambda: read_processes(nv, gpus)) if nv is not None else []
        return exposition(gpus, host, self.hostname, nv is not None, running_sessions(), processes)

    def close(self) -> None:
        if self._nv is not None:
            self._nv.close()
            self._nv = None


def serve(exporter: Exporter, address: str, port: int) -> ThreadingHTTPServer:
    """An HTTP server answering ``GET /metrics`` (call ``serve_forever`` on it; port 0: any free one)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?")[0] != "/metrics":
                body, status, kind = b"perfmagic exporter: metrics at /metrics\n", 404, "text/plain"
            else:
                body, status, kind = exporter.metrics().encode(), 200, CONTENT_TYPE
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(
            self, format: str, *args: Any
        ) -> None:  # a scrape every few seconds: no log line each
            pass

    return ThreadingHTTPServer((address, port), Handler)


def main(address: str, port: int, hostname: str | None) -> int:
    exporter = Exporter(hostname)
    try:
        server = serve(exporter, address, port)
    except OSError as e:
        print(f"perfmagic exporter: cannot listen on {address}:{port}: {e.strerror}", file=sys.stderr)
        exporter.close()
        return 1
    host, bound = str(server.server_address[0]), server.server_address[1]
    if exporter.nvml_reason:
        print(
            f"perfmagic exporter: no GPU metrics ({exporter.nvml_reason}); host metrics only", file=sys.stderr
        )
    print(
        f"perfmagic exporter: serving http://{host}:{bound}/metrics as Hostname={exporter.hostname}",
        flush=True,
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        exporter.close()
    return 0
