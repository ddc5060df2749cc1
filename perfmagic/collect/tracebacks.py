"""Tracebacks that are the user's own: an exception leaves perfmagic's wrappers without their frames.

perfmagic puts wrappers in place of library functions (``nn.Module.__call__``, ``DataLoader``'s
``__next__``, ``torch.autograd.backward``, ``print``, a trainer's ``fit``...). An exception raised
below one passes through its frame, and would show in the user's traceback once per wrapper it
crossed: ``torch_forward.py, in call`` once per level of ``nn.Module`` nesting. So each wrapper ends in

.. code-block:: python

    except BaseException as e:
        drop_own_frame(e)
        raise

which costs nothing until something is raised. Since Python 3.11 a bare ``raise`` re-raises with
the exception's ``__traceback__`` as it is at that moment and adds no entry for the frame it leaves,
so the exception goes on as though the wrapper had not been there: the traceback holds the same
frames as without perfmagic, whoever prints it (Python, IPython, a logger's ``exc_info``, a
DataLoader worker formatting its error for the main process). Python 3.10 re-raises the traceback
as it was caught: there the frames stay. This is what IPython's and pytest's ``__tracebackhide__``
do when they print, and JAX's ``traceback_util`` does to the exception itself, as here.

``PERFMAGIC_TRACEBACKS=full`` in the environment keeps the frames, to see perfmagic's part in an error.
"""

from __future__ import annotations

import os
import sys

TRACEBACKS_ENV = "PERFMAGIC_TRACEBACKS"
"""``full``: wrappers keep their frames in tracebacks."""


def drop_own_frame(exc: BaseException) -> None:
    """Called by a wrapper in its ``except``, before its bare ``raise``: its frame leaves ``exc``'s traceback.

    Only the caller's own frame goes, and only where it is the traceback's first entry, as it is in an
    ``except`` of the function itself. An error raised in the wrapper's own lines then shows at the user's
    call to it; perfmagic's helpers that the wrapper called keep their frames.
    """
    tb = exc.__traceback__
    if tb is not None and tb.tb_frame is sys._getframe(1) and os.environ.get(TRACEBACKS_ENV) != "full":
        exc.__traceback__ = tb.tb_next
