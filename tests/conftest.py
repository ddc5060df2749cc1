"""Shared pytest fixtures."""

from fake_nvml import fake_nvml  # noqa: F401  (fixture: a fake NVML at perfmagic's pynvml seam)
