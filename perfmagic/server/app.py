"""The server extension app: config, routes, and the monitor's lifetime."""

from __future__ import annotations

from jupyter_server.extension.application import ExtensionApp
from traitlets import Float, Unicode

from perfmagic.server.handlers import PROMETHEUS_KEY, SERVICE_KEY, handlers
from perfmagic.server.kernels import KernelIndex
from perfmagic.server.service import MonitorService


class PerfmagicExtension(ExtensionApp):
    """GPU monitor routes for the JupyterLab sidebar (``c.PerfmagicExtension.*`` to configure)."""

    name = "perfmagic"
    load_other_extensions = True

    idle_timeout_s = Float(30.0, help="Stop sampling after this many seconds without clients.").tag(
        config=True
    )
    prometheus_url = Unicode(
        "",
        help="The Prometheus the cluster view reads every node's GPUs from (e.g. http://prometheus:9090); "
        "queried by this server only.",
    ).tag(config=True)

    def initialize_settings(self) -> None:
        assert self.serverapp is not None  # set when the server links the extension
        web_app = self.serverapp.web_app
        kernels = KernelIndex(web_app.settings.get("kernel_manager"), web_app.settings.get("session_manager"))
        self.monitor = MonitorService(kernels, idle_timeout_s=self.idle_timeout_s)
        self.settings[SERVICE_KEY] = self.monitor
        self.settings[PROMETHEUS_KEY] = self.prometheus_url

    def initialize_handlers(self) -> None:
        self.handlers.extend(handlers())

    async def stop_extension(self) -> None:
        await self.monitor.stop()
