"""DistributedDataParallel's gradient reduction as the ``comm`` stage.

DDP all-reduces gradients from its C++ Reducer while backward runs, never through
``torch.distributed``'s Python functions, so the collective hooks cannot see it.
When backward's graph has run, the autograd engine calls its *final callbacks* in
the order they were queued, on the thread that finished the graph; the Reducer
queues ``finalize_backward`` there once its last bucket is launched, and that is
where the rank waits for every bucket's reduction (and for the slowest rank).

So, for a backward that follows a DDP forward which will reduce gradients
(grad enabled, not under ``no_sync``), a pre-hook on the root's ``grad_fn``
(the first node the engine runs, before any bucket is ready) queues callback A.
A runs first of the final callbacks: the graph's compute is over. A queues B,
which the engine runs after everything queued meanwhile, the Reducer's
finalize included. B − A is the rank's wait for gradient reduction; it is
recorded as ``comm`` inside ``backward`` by the training thread, once backward
returns. No comm hook is registered, so a user's own hook keeps its slot and
is timed the same way; the pre-hook is removed when backward returns.

On NCCL the finalize only makes the current CUDA stream wait for the reductions,
so the host's B − A is near 0. Where the recorder has a device clock, A and B
also take device event tokens (on the current stream, as every stage does): the span then
lasts from the device finishing backward's compute to it getting past the wait.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from perfmagic.collect.recorder import StageRecorder
from perfmagic.collect.stage_wrapper import named_like
from perfmagic.collect.tracebacks import drop_own_frame
from perfmagic.collect.windowed_hooks import WindowedHooks


class ReducerWait:
    """Wraps ``torch.autograd.backward`` (``Tensor.backward`` calls it) as ``backward``, with DDP's wait inside.

    Until a stronger boundary is seen, each backward it records also ends a step: the rhythm of a loop
    that updates its parameters by hand (``perfmagic.step_policy``)."""

    def __init__(self, torch: Any, recorder: StageRecorder) -> None:
        self._torch = torch
        self._recorder = recorder
        self._engine = torch.autograd.Variable._execution_engine
        self._ddp = torch.nn.parallel.DistributedDataParallel
        self.pending = False  # a DDP forward that will reduce gradients ran since the last backward
        # (start, end, device event tokens at both) of each wait, appended from the thread that finishes the graph
        self._waits: list[tuple[float, float, object | None, object | None]] = []

    def install(self, windowed: WindowedHooks) -> None:
        torch = self._torch
        # Tensor.backward calls torch.autograd.backward by its module attribute: one wrapper times both,
        # and each wrapper in the step costs a fast loop a microsecond or two
        windowed.set(torch.autograd, "backward", self.wrap)
        windowed.set(self._ddp, "forward", self._noting_reduction)

    def _noting_reduction(self, orig_forward: Callable[..., Any]) -> Callable[..., Any]:
        """DDP's ``forward``, noting a forward that will reduce gradients in the next backward."""
        grad_enabled = self._torch.is_grad_enabled

        def forward(module: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                # the Reducer prepares for backward under the same condition (DDP._pre_forward)
                if grad_enabled() and module.require_backward_grad_sync:
                    self.pending = True
                return orig_forward(module, *args, **kwargs)
            except BaseException as e:
                drop_own_frame(e)
                raise

        return forward

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        rec = self._recorder
        backward_id, comm_id = rec.stage_id("backward"), rec.stage_id("comm")
        enter, exit_ = rec.enter, rec.exit

        def recorded(*args: Any, **kwargs: Any) -> Any:
            try:
                if not enter(backward_id):
                    return fn(*args, **kwargs)
                handle = None
                try:
                    if self.pending:
                        self.pending = False
                        handle = self._arm(args[0] if args else kwargs.get("tensors"))
                    return fn(*args, **kwargs)
                finally:
                    if handle is not None:
                        handle.remove()
                    if self._waits:
                        waits, self._waits = self._waits, []
                        for start, end, start_token, end_token in waits:
                            rec.record_within(comm_id, start, end, (start_token, end_token))
                    exit_()
                    if rec.rhythm_wanted:  # no optimizer step, batch or perfmagic.step() yet (step_policy)
                        rec.boundary("backward")
            except BaseException as e:
                drop_own_frame(e)
                raise

        return named_like(recorded, fn)

    def _arm(self, roots: Any) -> Any:
        """Queue the callbacks around the Reducer's finalize when the engine starts this graph; the pre-hook's handle."""
        tensors = [roots] if isinstance(roots, self._torch.Tensor) else list(roots or ())
        root = next((t.grad_fn for t in tensors if getattr(t, "grad_fn", None) is not None), None)
        if root is None:
            return None
        queue = self._engine.queue_callback
        waits = self._waits
        event_token, now = self._recorder.device_event_token, self._recorder.clock.now

        def compute_done() -> None:
            start, start_token = now(), event_token()

            def reduced() -> None:
                end = now()
                waits.append((start, end, start_token, event_token()))

            queue(reduced)

        def started(grad_outputs: Any) -> None:
            queue(compute_done)

        return root.register_prehook(started)
