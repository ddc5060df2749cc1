"""Shared pytest fixtures."""

from fake_nvml import fake_nvml  # noqa: F401  (fixture: a fake NVML at perfmagic's pynvml seam)

pytest_plugins = ("pytest_jupyter.jupyter_server",)
