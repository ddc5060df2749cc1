"""The ``logging`` stage of torch loops: printing, logging, TensorBoard writers and progress bars.

Host-device syncs (``item()`` and the like) are ``logging`` too: ``collect.torch_tensors`` times them.
"""

from __future__ import annotations

import builtins
import logging
import sys
from typing import Any

from perfmagic.collect.patching import Patcher
from perfmagic.collect.recorder import StageRecorder

_PROGRESS_BARS = (("tqdm.std", "tqdm"), ("tqdm.notebook", "tqdm_notebook"), ("tqdm.rich", "tqdm_rich"))
"""tqdm classes whose ``display`` draws the bar, patched when the profiled code already imported them."""


def install_logging(rec: StageRecorder, p: Patcher) -> None:
    """Time ``print``, ``Logger.handle``, writes to ``sys.stdout``/``stderr``, TensorBoard's ``SummaryWriter``
    (torch's and tensorboardX's, where imported) and tqdm bars' drawing as ``logging``."""
    p.set(builtins, "print", rec.wrap(builtins.print, "logging"))
    p.set(logging.Logger, "handle", rec.wrap(logging.Logger.handle, "logging"))
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None:
            p.set(sys, name, _TimedStream(stream, rec))
    writers = []
    if "torch.utils.tensorboard" in sys.modules:
        writers.append(sys.modules["torch.utils.tensorboard"].SummaryWriter)
    if "tensorboardX" in sys.modules:
        writers.append(sys.modules["tensorboardX"].SummaryWriter)
    for cls in writers:
        for attr in dir(cls):
            if attr.startswith("add_") or attr == "flush":
                p.set(cls, attr, rec.wrap(getattr(cls, attr), "logging"))
    # A progress bar made before profiling holds the original stderr: time its drawing itself.
    for module, cls_name in _PROGRESS_BARS:
        bar = getattr(sys.modules.get(module), cls_name, None)
        if bar is not None and "display" in vars(bar):
            p.set(bar, "display", rec.wrap(bar.display, "logging"))


class _TimedStream:
    """A text stream proxy whose writes are recorded as the ``logging`` stage."""

    def __init__(self, stream: Any, recorder: StageRecorder) -> None:
        self._stream = stream
        self.write = recorder.wrap(stream.write, "logging")
        self.flush = recorder.wrap(stream.flush, "logging")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)
