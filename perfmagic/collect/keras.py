"""Keras hooks: ``Model.fit``'s steps, its input wait, and the standard callbacks' saving and logging.

What is patched (on the classes, so models made before profiling are covered;
all put back by :meth:`KerasHooks.uninstall`):

========== ==================================================================
steps      ``Model.fit`` gets one more callback: a step boundary (kind
           ``optimizer``) at each ``on_train_batch_end``; the settings the
           advice is written in are noted (``trainer`` mark
           ``keras.Model.fit``: backend, ``jit_compile``, dtype policy)
data       TensorFlow backend: the train function takes the next element
           from the iterator itself, inside its compiled graph, where no
           Python hook sees it. ``Model.make_train_function``'s function is
           wrapped so that the element is taken first, timed as ``data``,
           then handed to Keras's compiled one-step function, the path Keras
           itself takes for iterators that are not tf.data's. Other
           backends take batches in Python: ``collect.tfdata`` times them
forward    the rest of the train step: forward, backward and optimizer are
           one compiled function, recorded as one ``forward`` stage
checkpoint ``ModelCheckpoint._save_model``, ``BackupAndRestore._save_model``
logging    ``TensorBoard``, ``CSVLogger`` and ``ProgbarLogger`` callbacks
evaluation ``fit``'s validation (``on_test_begin``/``on_test_end`` of the same
           callback): an evaluation pass, kept out of the training steps
========== ==================================================================
"""

from __future__ import annotations

import importlib
import inspect
import sys
import weakref
from collections.abc import Callable
from typing import Any

from perfmagic.collect.call_hints import call_hint
from perfmagic.collect.evaluation import EvaluationPasses
from perfmagic.collect.patching import Patcher
from perfmagic.collect.recorder import StageRecorder
from perfmagic.collect.tracebacks import drop_own_frame
from perfmagic.schema import TRAINER_MARK

KERAS_TRAINER = "keras.Model.fit"

CALLBACK_STAGES: tuple[tuple[str, str, str, str], ...] = (
    ("keras.src.callbacks.model_checkpoint", "ModelCheckpoint", "_save_model", "checkpoint"),
    ("keras.src.callbacks.backup_and_restore", "BackupAndRestore", "_save_model", "checkpoint"),
    ("keras.src.callbacks.tensorboard", "TensorBoard", "on_train_batch_end", "logging"),
    ("keras.src.callbacks.tensorboard", "TensorBoard", "on_epoch_end", "logging"),
    ("keras.src.callbacks.csv_logger", "CSVLogger", "on_epoch_end", "logging"),
    ("keras.src.callbacks.progbar_logger", "ProgbarLogger", "on_train_batch_end", "logging"),
    ("keras.src.callbacks.progbar_logger", "ProgbarLogger", "on_epoch_end", "logging"),
)
"""(module, class, method, stage): the standard callbacks' work, by stage."""


class KerasHooks:
    """Installs the Keras patches; :meth:`uninstall` removes them and unwraps the models' train functions."""

    def __init__(self, recorder: StageRecorder, on_backend: Callable[[str], None]) -> None:
        self._recorder = recorder
        self._on_backend = on_backend  # told the backend that trains (the report's ``framework``)
        self._patcher = Patcher()
        self._evaluation = EvaluationPasses(recorder)
        # models whose train function is wrapped: (model, the wrapper, Keras's function)
        self._wrapped: list[tuple[weakref.ref[Any], Callable[..., Any], Callable[..., Any]]] = []
        self._noted: set[int] = set()
        self.warnings: list[str] = []

    def install(self) -> None:
        import keras

        for module_name, owner_name, attr, stage in CALLBACK_STAGES:
            owner = getattr(importlib.import_module(module_name), owner_name, None)
            method = getattr(owner, attr, None)
            if method is not None:  # another Keras version: nothing of that name to time
                self._patcher.set(owner, attr, self._recorder.wrap(method, stage))
        model = keras.Model
        self._patcher.set(model, "fit", self._fit(model.fit))
        if keras.backend.backend() == "tensorflow":
            self._patcher.set(
                model, "make_train_function", self._make_train_function(model.make_train_function)
            )

    def uninstall(self) -> list[str]:
        for ref, wrapper, original in self._wrapped:
            model = ref()
            if model is not None and getattr(model, "train_function", None) is wrapper:
                model.train_function = original
        self._wrapped = []
        return [*self.warnings, *self._patcher.restore()]

    # -- steps -----------------------------------------------------------

    def _fit(self, fit: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(fit)
        recorder = self._recorder

        def fit_profiled(model: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                if not recorder.on_recorded_thread():
                    return fit(model, *args, **kwargs)
                self._note(model)
                bound = signature.bind(model, *args, **kwargs)
                callbacks = bound.arguments.get("callbacks")
                if callbacks is None or isinstance(callbacks, (list, tuple)):
                    bound.arguments["callbacks"] = [
                        *(callbacks or []),
                        _step_callback(recorder, self._evaluation),
                    ]
                else:  # a CallbackList the user built: adding to it would change their object
                    self.warnings.append("Model.fit was given a CallbackList: its steps were not marked")
                return fit(*bound.args, **bound.kwargs)
            except BaseException as e:
                drop_own_frame(e)
                raise

        fit_profiled.__wrapped__ = fit  # type: ignore[attr-defined]
        return fit_profiled

    def _note(self, model: Any) -> None:
        """The backend, and the settings the advice's Keras fixes are written in (once per model)."""
        import keras

        backend = keras.backend.backend()
        self._on_backend(backend)
        if id(model) in self._noted:
            return
        self._noted.add(id(model))
        policy = getattr(model, "dtype_policy", None) or keras.mixed_precision.global_policy()
        settings = {
            "backend": backend,
            "jit_compile": _plain(getattr(model, "jit_compile", None)),
            "mixed_precision": _plain(getattr(policy, "name", None)),
            "steps_per_execution": _plain(getattr(model, "steps_per_execution", None)),
        }
        # the user's model.compile(...): the XLA fix is that call with jit_compile=True
        compiled = {"jit_compile": settings["jit_compile"]}
        settings["compile_call"] = call_hint(model, sys._getframe(2), method="compile", values=compiled)
        recorder = self._recorder
        recorder.timeline.add_mark(
            recorder.clock.now() - recorder.origin,
            TRAINER_MARK,
            trainer=KERAS_TRAINER,
            version=keras.__version__,
            settings=settings,
        )

    # -- data (TensorFlow backend) ------------------------------------------

    def _make_train_function(self, make: Callable[..., Any]) -> Callable[..., Any]:
        def make_profiled(model: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                out = make(model, *args, **kwargs)
                function = getattr(model, "train_function", None)
                if function is not None and not getattr(function, "_perfmagic", False):
                    wrapper = self._split_data(model, function)
                    model.train_function = wrapper
                    self._wrapped.append((weakref.ref(model), wrapper, function))
                return out
            except BaseException as e:
                drop_own_frame(e)
                raise

        make_profiled.__wrapped__ = make  # type: ignore[attr-defined]
        return make_profiled

    def _split_data(self, model: Any, function: Callable[..., Any]) -> Callable[..., Any]:
        """The train function with the next element taken outside its graph, as ``data``."""
        import tensorflow as tf

        recorder = self._recorder
        data, forward = recorder.stage_id("data"), recorder.stage_id("forward")
        iterators = (tf.data.Iterator, tf.distribute.DistributedIterator)
        whole = recorder.wrap(function, "forward")

        def train_function(iterator: Any) -> Any:
            try:
                if getattr(model, "steps_per_execution", 1) != 1 or not isinstance(iterator, iterators):
                    return whole(iterator)  # several steps per call: the loop stays in the graph
                if not recorder.enter(data):
                    return function(iterator)
                try:
                    element = iterator.get_next()  # the end of the data: OutOfRangeError, as Keras expects
                finally:
                    recorder.exit()
                recorded = recorder.enter(forward)
                try:
                    return function(iter((element,)))
                finally:
                    if recorded:
                        recorder.exit()
            except BaseException as e:
                drop_own_frame(e)
                raise

        train_function._perfmagic = True  # type: ignore[attr-defined]
        train_function.__wrapped__ = function  # type: ignore[attr-defined]
        return train_function


def _step_callback(recorder: StageRecorder, evaluation: EvaluationPasses) -> Any:
    """A Keras callback that ends a step at each train batch's end (the train step, where not timed
    by the data split, as ``forward``) and keeps ``fit``'s validation out of the steps."""
    import keras

    forward = recorder.stage_id("forward")

    class PerfmagicSteps(keras.callbacks.Callback):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self._open = False
            self._validating = False

        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            # the TensorFlow backend's split times the step itself: this one would hold the data wait too
            self._open = keras.backend.backend() != "tensorflow" and recorder.enter(forward)

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            if self._open:
                self._open = False
                recorder.exit()
            recorder.boundary("optimizer")

        def on_test_begin(self, logs: Any = None) -> None:
            self._validating = evaluation.begin("validation")

        def on_test_end(self, logs: Any = None) -> None:
            if self._validating:
                self._validating = False
                evaluation.end()

    return PerfmagicSteps()


def _plain(value: Any) -> Any:
    """A setting as a JSON scalar (others as their text)."""
    return value if value is None or isinstance(value, (bool, int, float, str)) else str(value)
