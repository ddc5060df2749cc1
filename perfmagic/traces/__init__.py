"""Readers of traces that ``torch.profiler`` already wrote: collectors of past runs.

:mod:`perfmagic.trace_report` turns them into a report (``perfmagic report``).
"""

from __future__ import annotations

from perfmagic.traces.events import KinetoTrace
from perfmagic.traces.kineto import TraceFormatError, read_trace

__all__ = ["KinetoTrace", "TraceFormatError", "read_trace"]
