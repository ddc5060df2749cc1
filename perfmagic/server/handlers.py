"""Authenticated REST and WebSocket routes of the GPU monitor.

``GET {base_url}/perfmagic/api/snapshot`` returns the latest snapshot; the WebSocket
``{base_url}/perfmagic/api/stream`` pushes snapshots at the client's rate (``?rate=HZ`` or a
``{"rate": HZ}`` message) and honours ``{"pause": true|false}``; ``GET {base_url}/perfmagic/metrics``
is the latest snapshot for Prometheus; ``GET {base_url}/perfmagic/api/cluster`` every node's GPUs from
the configured Prometheus. Without a token each answers 403.
"""

from __future__ import annotations

import json
import socket
import time
from typing import Any

from jupyter_core.utils import ensure_async
from jupyter_server.auth.decorator import authorized, ws_authenticated
from jupyter_server.base.handlers import APIHandler, AuthenticatedFileHandler, JupyterHandler
from jupyter_server.base.websocket import WebSocketMixin
from tornado import web
from tornado.httpclient import AsyncHTTPClient
from tornado.websocket import WebSocketClosedError, WebSocketHandler

from perfmagic.registry import running_sessions
from perfmagic.render.prometheus import CONTENT_TYPE, exposition
from perfmagic.server.cluster import ClusterView, cluster_view
from perfmagic.server.service import DEFAULT_HZ, MonitorService, clamp_rate

Json = dict[str, Any]

# The monitor shows which kernel runs where and which notebook it belongs to: reading it is
# reading kernel information, so fine-grained authorizers (JupyterHub RBAC) treat it the same.
AUTH_RESOURCE = "kernels"
SERVICE_KEY = "perfmagic_monitor"
PROMETHEUS_KEY = "perfmagic_prometheus_url"


def _service(handler: web.RequestHandler) -> MonitorService:
    service: MonitorService = handler.settings[SERVICE_KEY]
    return service


def _with_age(snap: Json) -> Json:
    """The snapshot plus how old it is, so clients can flag a stuck sampler (a hung driver)."""
    age = max(0.0, time.time() - snap["time"]) if snap.get("time") else None
    return {**snap, "age_s": age}


class SnapshotHandler(APIHandler):
    """``GET``: the latest snapshot as JSON."""

    auth_resource = AUTH_RESOURCE

    @web.authenticated
    @authorized
    async def get(self) -> None:
        snap = await _service(self).get_snapshot()
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(_with_age(snap)))


class MetricsHandler(APIHandler):
    """``GET``: the latest snapshot in Prometheus' text format, under dcgm-exporter's names
    (a scrape sends the server's token: ``Authorization: Bearer TOKEN``)."""

    auth_resource = AUTH_RESOURCE

    @web.authenticated
    @authorized
    async def get(self) -> None:
        snap = await _service(self).get_snapshot()
        nvml = snap.get("nvml") or {}
        gpus, host, hostname = snap.get("gpus") or [], snap.get("host"), socket.gethostname()
        processes = snap.get("processes") or []
        text = exposition(gpus, host, hostname, bool(nvml.get("available")), running_sessions(), processes)
        self.set_header("Content-Type", CONTENT_TYPE)
        self.set_header("Cache-Control", "no-store")
        self.finish(text)


class ClusterHandler(APIHandler):
    """``GET``: every node's GPUs from the Prometheus configured as ``c.PerfmagicExtension.prometheus_url``
    (queried here, on the server: the browser never sees that URL)."""

    auth_resource = AUTH_RESOURCE

    @web.authenticated
    @authorized
    async def get(self) -> None:
        url = self.settings.get(PROMETHEUS_KEY)
        view: ClusterView = (
            await cluster_view(url, _fetch)
            if url
            else {"prometheus": {"configured": False, "reachable": False, "error": None}, "nodes": []}
        )
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(view))


async def _fetch(url: str) -> bytes:
    response = await AsyncHTTPClient().fetch(url, connect_timeout=3, request_timeout=5)
    body: bytes = response.body
    return body


class StreamHandler(WebSocketMixin, WebSocketHandler, JupyterHandler):
    """WebSocket of snapshots; one subscription on the shared sampler per connection."""

    auth_resource = AUTH_RESOURCE
    rate_hz = DEFAULT_HZ
    paused = False
    _last_sent = 0.0

    def set_default_headers(self) -> None:
        """JupyterHandler's headers (CSP etc.) make no sense on a WebSocket upgrade."""

    async def pre_get(self) -> None:
        authorized_ = await ensure_async(
            self.authorizer.is_authorized(self, self.current_user, "read", AUTH_RESOURCE)
        )
        if not authorized_:
            raise web.HTTPError(403)

    @ws_authenticated
    async def get(self, *args: Any, **kwargs: Any) -> None:
        await self.pre_get()
        res = super().get(*args, **kwargs)
        if res is not None:
            await res

    def open(self, *args: Any, **kwargs: Any) -> None:
        super().open(*args, **kwargs)  # WebSocketMixin: keep-alive pings
        rate = self.get_argument("rate", None)
        self.rate_hz = clamp_rate(_to_float(rate))
        service = _service(self)
        service.subscribe(self._on_snapshot, self.rate_hz)
        if service.latest is not None:
            self._send(service.latest)

    def on_message(self, message: str | bytes) -> None:
        try:
            msg = json.loads(message)
        except ValueError:
            msg = None
        if not isinstance(msg, dict):
            self._write({"type": "error", "message": "expected a JSON object"})
            return
        service = _service(self)
        if "rate" in msg:
            self.rate_hz = clamp_rate(_to_float(msg["rate"]), self.rate_hz)
        if "pause" in msg:
            if not isinstance(msg["pause"], bool):
                self._write({"type": "error", "message": '"pause" takes true or false'})
                return
            self.paused = msg["pause"]
        service.set_rate(self._on_snapshot, None if self.paused else self.rate_hz)
        self._write({"type": "config", "rate_hz": self.rate_hz, "paused": self.paused})
        if not self.paused and service.latest is not None and "pause" in msg:
            self._send(service.latest)  # resume shows current numbers at once

    def on_close(self) -> None:
        _service(self).unsubscribe(self._on_snapshot)

    def _on_snapshot(self, snap: Json) -> None:
        # The sampler runs at the fastest client's rate; slower clients skip samples.
        # 0.9: a sample that arrives a little early must not halve the rate.
        if self.paused or time.monotonic() - self._last_sent < 0.9 / self.rate_hz:
            return
        self._send(snap)

    def _send(self, snap: Json) -> None:
        self._last_sent = time.monotonic()
        self._write(_with_age(snap))

    def _write(self, msg: Json) -> None:
        try:
            self.write_message(json.dumps(msg))
        except WebSocketClosedError:
            _service(self).unsubscribe(self._on_snapshot)


def _to_float(x: object) -> float | None:
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return float(x)
    if isinstance(x, str):
        try:
            return float(x)
        except ValueError:
            return None
    return None


class BokehJSHandler(AuthenticatedFileHandler):
    """BokehJS for the notebook's reports: fetched once per page instead of saved in every report."""

    def initialize(self) -> None:  # type: ignore[override]
        from bokeh.util.paths import bokehjs_path

        super().initialize(path=str(bokehjs_path() / "js"))

    def set_extra_headers(self, path: str) -> None:
        # the URL names the version (?v=): a cached copy is never stale
        self.set_header("Cache-Control", "private, max-age=31536000, immutable")


def handlers() -> list[tuple[str, type[web.RequestHandler]]]:
    """Routes relative to the server's base_url."""
    return [
        (r"/perfmagic/api/snapshot", SnapshotHandler),
        (r"/perfmagic/metrics", MetricsHandler),
        (r"/perfmagic/api/cluster", ClusterHandler),
        (r"/perfmagic/api/stream", StreamHandler),
        (r"/perfmagic/static/(bokeh\.min\.js)", BokehJSHandler),
    ]
