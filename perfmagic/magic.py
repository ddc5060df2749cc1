"""IPython magics: ``%%gpuprofile`` and ``%gpumonitor`` (the only module that imports IPython).

``%%gpuprofile`` runs its cell the way IPython would without it (same namespace,
the last expression's value as the cell's result, the usual traceback), with a
profile around it. As ``%time`` does, the cell is compiled here and executed in
the user namespace rather than through a nested ``run_cell``: then an exception
or Ctrl-C leaves the cell itself failed, so "run all" stops there, and the
traceback is shown once: the one the same cell shows without the magic, its
syntax errors too (``perfmagic.cells``).
"""

from __future__ import annotations

import html
import shlex
from collections.abc import Callable
from pathlib import Path
from types import CodeType
from typing import Any, TypeVar, cast

from IPython import display as _display
from IPython.core import magic_arguments as _magic_arguments
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.core.magic import Magics, line_cell_magic, line_magic, magics_class, output_can_be_silenced

from perfmagic.cells import compile_body, shown_from_body, syntax_check
from perfmagic.price import gpu_hour_price
from perfmagic.report import Report
from perfmagic.session import Session, active_session

# IPython's helpers carry no annotations: typed here, so strict mypy checks the magics themselves.
_F = TypeVar("_F", bound=Callable[..., Any])
parse_argstring: Any = _magic_arguments.parse_argstring
display: Any = _display.display
_argument: Any = _magic_arguments.argument
_magic_arguments_decorator: Any = _magic_arguments.magic_arguments


def argument(*args: Any, **kwargs: Any) -> Callable[[_F], _F]:
    return cast(Callable[[_F], _F], _argument(*args, **kwargs))


def magic_arguments() -> Callable[[_F], _F]:
    return cast(Callable[[_F], _F], _magic_arguments_decorator())


_NOTHING = object()
_ALREADY = (
    "another perfmagic profile is running in this kernel (a `with perfmagic.profile()` block, or a "
    "%%gpuprofile cell still running in a thread): perfmagic profiles one block at a time"
)
_ASYNC = (
    "%%gpuprofile cannot run a cell with top-level `await`: the magic runs the cell synchronously. "
    "Profile inside the coroutine instead:\n\n"
    "    with perfmagic.profile() as session:\n        await train()\n    session.report"
)


@magics_class
class PerfMagics(Magics):
    """``%%gpuprofile`` and ``%gpumonitor``."""

    def __init__(self, shell: Any) -> None:
        super().__init__(shell)
        self._monitor: Any = None
        self._monitor_handle: Any = None  # the panel, then the summary that takes its place

    @property
    def _shell(self) -> InteractiveShell:
        assert self.shell is not None, "magics are used from a shell"
        return self.shell

    @magic_arguments()
    @argument(
        "--interval", type=float, default=0.1, metavar="S", help="seconds between samples (default 0.1)"
    )
    @argument(
        "--trace",
        action="store_true",
        help="also run the framework's profiler (torch.profiler, TensorFlow's or JAX's) for a few steps (see "
        "--steps); its Chrome trace goes to the output directory and into report.to_chrome_trace()",
    )
    @argument(
        "--steps",
        type=int,
        default=None,
        metavar="N",
        help="with --trace: steps the profiler records, after 1 skipped step (and 1 warm-up step for "
        "torch.profiler; default 5)",
    )
    @argument(
        "--outdir", metavar="DIR", help="where the spool, report.json and traces go (default: a temp dir)"
    )
    @argument(
        "--tune",
        action="store_true",
        help="after the cell, try more DataLoader workers and other thread counts on copies of what it "
        "trained, and put measured speed-ups on the cards (see --tune-budget)",
    )
    @argument(
        "--full",
        action="store_true",
        help="record every step's stages (default: every step of the first 200 steps and 30 s, then 5 "
        "steps in every 53 or more; the step times of all steps)",
    )
    @argument(
        "--tune-budget",
        type=float,
        default=None,
        metavar="S",
        help="with --tune: seconds tuning may take (default: the smaller of 60 s and a quarter of the cell's time)",
    )
    @argument(
        "--price-per-gpu-hour",
        type=float,
        default=None,
        metavar="PRICE",
        help="what one GPU costs for an hour (else $PERFMAGIC_PRICE_PER_GPU_HOUR): the report adds cost per "
        "hour, per sample and per epoch",
    )
    @argument("--json", metavar="FILE", help="also write the report as JSON to FILE")
    @argument("--html", metavar="FILE", help="also write the report as one self-contained HTML file")
    @argument("--no-live", action="store_true", help="no live panel while the cell runs")
    @argument(
        "--quiet", action="store_true", help="no live panel and no report output (use -o / -v / --json)"
    )
    @argument("-o", dest="return_report", action="store_true", help="return the Report as the cell's result")
    @argument("-v", dest="var", metavar="NAME", help="store the Report in the variable NAME")
    @argument(
        "--compare",
        nargs=2,
        metavar=("A", "B"),
        help="line magic: compare two reports (variables holding a Report, or report JSON files), A before B",
    )
    @line_cell_magic
    @output_can_be_silenced
    def gpuprofile(self, line: str = "", cell: str | None = None) -> Any:
        """Profile a training cell: live panel while it runs, then a report on why it is slow.

        ``%%gpuprofile [options]`` on the first line of a cell runs the cell as
        usual (its variables stay, its last value is shown, its traceback is the
        usual one) and shows what each training stage and the hardware did. If the
        cell raises or is interrupted, the report of what ran is shown, then the
        traceback; one that fails before its first training step shows its
        traceback alone, and leaves -v's variable and the --json and --html
        files as they were. ``%gpuprofile --compare A B`` shows two reports
        side by side.

        Steps are counted at each optimizer step or DataLoader batch; a loop that
        has neither (a custom or non-torch loop) calls ``perfmagic.step()`` at the
        end of each step, or the report has no stage breakdown.

        Examples::

            %%gpuprofile
            for x, y in loader:
                ...

            %%gpuprofile -v before --html before.html
            train(epochs=1)

            %%gpuprofile --trace --steps 3 --outdir runs/traced
            train(epochs=1)

            %gpuprofile --compare before after
        """
        __tracebackhide__ = True
        args = self._parse(PerfMagics.gpuprofile, line)
        if args.var is not None and not args.var.isidentifier():
            raise UsageError(f"-v takes a variable name, got {args.var!r}")
        if args.compare is not None:
            if cell is not None:
                raise UsageError("--compare is a line magic: %gpuprofile --compare A B")
            return self._compare(args)
        if cell is None:
            raise UsageError(
                "%%gpuprofile is a cell magic: put `%%gpuprofile [options]` (two %) on the first line of the "
                "training cell; the line form only takes --compare A B"
            )
        if not args.interval > 0:
            raise UsageError(f"--interval must be a positive number of seconds, got {args.interval}")
        if args.steps is not None and not args.trace:
            raise UsageError("--steps sets how many steps --trace records: add --trace")
        if args.steps is not None and args.steps < 1:
            raise UsageError(f"--steps must be at least 1, got {args.steps}")
        if args.tune_budget is not None and not args.tune:
            raise UsageError("--tune-budget sets how long --tune may take: add --tune")
        if args.tune_budget is not None and not 0 < args.tune_budget < float("inf"):
            raise UsageError(f"--tune-budget must be a positive number of seconds, got {args.tune_budget}")
        try:
            args.price_per_gpu_hour = gpu_hour_price(args.price_per_gpu_hour)
        except ValueError as e:
            raise UsageError(str(e).replace("price_per_gpu_hour", "--price-per-gpu-hour")) from None
        report, value = self._profile_cell(args, line, cell)
        if args.return_report:
            if value is not _NOTHING and value is not None:
                self._shell.displayhook(value)
            return report
        return None if value is _NOTHING else value

    @magic_arguments()
    @argument("action", nargs="?", choices=("start", "stop"), default="start", help="start (default) or stop")
    @argument(
        "--interval", type=float, default=0.5, metavar="S", help="seconds between samples (default 0.5)"
    )
    @line_magic
    def gpumonitor(self, line: str = "") -> None:
        """Show a live GPU and host monitor without profiling any code: ``%gpumonitor [start|stop]``.

        The monitor keeps updating while the kernel is idle or runs other cells,
        until ``%gpumonitor stop``, which leaves a summary in its place: how long it
        ran, each GPU's mean and peak utilization, memory peak and mean power, and
        the host's CPU. Starting it again restarts it.
        """
        args = self._parse(PerfMagics.gpumonitor, line)
        if not args.interval > 0:
            raise UsageError(f"--interval must be a positive number of seconds, got {args.interval}")
        self.stop_monitor()
        if args.action == "start":
            from perfmagic.monitor import Monitor

            self._monitor = Monitor(interval=args.interval)
            self._monitor_handle = display(self._monitor.panel.widget, display_id=True)
            self._monitor.start()

    def stop_monitor(self) -> None:
        """Stop the ``%gpumonitor`` monitor, if one runs: its summary takes the panel's place (static: a
        saved notebook keeps no widget view whose model is gone)."""
        if self._monitor is None:
            return
        from perfmagic.render.notebook import monitor_bundle

        monitor, self._monitor = self._monitor, None
        handle, self._monitor_handle = self._monitor_handle, None
        try:
            warnings = monitor.stop()
            if handle is not None:  # before the widgets close: a saved notebook has no view without a model
                summary = monitor_bundle(monitor.summary(), warnings)
                last = monitor.panel.snapshot("its last look")  # the chart, static, under the summary
                handle.update({**summary, "text/html": summary["text/html"] + last["text/html"]}, raw=True)
        finally:
            monitor.close()

    # -- %%gpuprofile ------------------------------------------------------

    def _profile_cell(self, args: Any, line: str, cell: str) -> tuple[Report | None, Any]:
        __tracebackhide__ = True
        body, last, filename = self._compile(line, cell)
        if active_session() is not None:
            raise UsageError(_ALREADY)
        if args.trace:
            from perfmagic.collect.imports import installed

            if not installed("torch"):
                raise UsageError("--trace runs torch.profiler, and torch is not installed")
        # --steps needs --trace; without --steps, Session's default number of steps
        session = Session(
            interval=args.interval,
            outdir=args.outdir,
            trace=args.steps or args.trace,
            tune=args.tune,
            tune_budget=args.tune_budget,
            price_per_gpu_hour=args.price_per_gpu_hour,
            full=args.full,
        )
        view = None if args.no_live or args.quiet else _LiveView(session)
        if view is not None:
            session.add_tick_listener(view.panel.update)
        ns, gns = self._shell.user_ns, self._shell.user_global_ns
        value: Any = _NOTHING
        error: BaseException | None = None
        try:
            with session:
                exec(body, gns, ns)
                if last is not None:
                    value = eval(last, gns, ns)
        except BaseException as e:
            error = e
            shown_from_body(e, self._shell, filename)  # the traceback the cell shows without the magic
            raise
        finally:
            try:
                report = self._deliver(session, view, args, error)
            finally:
                if view is not None:  # whatever _deliver did not get to: its widgets close all the same
                    view.close(None, "the report could not be shown")
        return report, value

    def _deliver(
        self, session: Session, view: _LiveView | None, args: Any, error: BaseException | None
    ) -> Report | None:
        """Show and export the report of whatever ran; never hides the cell's own exception."""
        try:
            report = session.report
        except RuntimeError:  # stopping failed: the exception already propagating says why
            if view is not None:
                view.close(None, "the report could not be built")
            return None
        if error is not None and not report.steps.get("count"):
            # It failed before training: its traceback alone says why, and -v, --json and --html keep what
            # they held (an earlier run's report, say) rather than an empty one.
            self._note_unprofiled(view, args, type(error).__name__, session.outdir)
            return None
        if args.var is not None:
            self._shell.user_ns[args.var] = report
        links = self._export(report, session.outdir, args)
        show = not args.quiet and (not args.return_report or error is not None)
        from perfmagic.render.notebook import report_bundle

        bundle = report_bundle(report.to_dict(), links) if show else None
        reason = None if error is None else type(error).__name__
        if view is not None:
            view.close(report, reason, bundle)
        elif bundle is not None:
            display(bundle, raw=True)
        return report

    def _note_unprofiled(self, view: _LiveView | None, args: Any, error: str, outdir: Path) -> None:
        from perfmagic.render.notebook import unprofiled_bundle

        note = unprofiled_bundle(error, str(outdir))
        if view is not None:
            view.close(None, error, summary=note)
        elif not args.quiet:
            display(note, raw=True)

    def _export(self, report: Report, outdir: Path, args: Any) -> list[tuple[str, str]]:
        written: list[tuple[str, Path]] = []
        problems = []
        for label, path, write in (
            ("JSON", args.json, report.to_json),
            ("HTML", args.html, report.to_html),
        ):
            if path:
                try:
                    write(path)
                    written.append((label, Path(path)))
                except OSError as e:
                    problems.append(f"could not write {label} to {path}: {e.strerror or e}")
        written.append(("report.json", outdir / "report.json"))
        profiler = {"tensorflow": "TensorFlow profiler", "jax": "JAX profiler"}
        for trace in report["torch_traces"]:
            written.append(
                (f"{profiler.get(trace.get('profiler'), 'torch.profiler')} trace", Path(trace["path"]))
            )
        for problem in problems:
            print(f"perfmagic: {problem}")
        return [(label, _href(path)) for label, path in written]

    def _compile(self, line: str, cell: str) -> tuple[CodeType, CodeType | None, str]:
        """The cell as IPython would run it (``cells.compile_body``), and the file name it is compiled as."""
        shell: Any = self._shell
        source = shell.transform_cell(cell)
        if shell.should_run_async(cell, transformed_cell=source, preprocessing_exc_tuple=None):
            raise UsageError(_ASYNC)
        return compile_body(shell, line, cell, source, _cell_number(shell, cell))

    # -- %gpuprofile --compare ---------------------------------------------

    def _compare(self, args: Any) -> Any:
        from perfmagic.render.notebook import comparison_bundle

        a, b = (self._report_named(name) for name in args.compare)
        comparison = a.compare(b)
        if args.var is not None:
            self._shell.user_ns[args.var] = comparison
        if args.return_report:
            return comparison
        if not args.quiet:
            display(comparison_bundle(comparison.to_dict(), str(comparison), tuple(args.compare)), raw=True)
        return None

    def _report_named(self, name: str) -> Report:
        value = self._shell.user_ns.get(name, _NOTHING)
        if isinstance(value, Report):
            return value
        if value is _NOTHING and Path(name).is_file():
            return Report.load(name)
        raise UsageError(
            f"--compare: {name!r} is neither a variable holding a perfmagic Report nor a report file"
        )

    def _parse(self, magic: Any, line: str) -> Any:
        try:
            return parse_argstring(magic, _without_comment(line))
        except UsageError as e:
            usage = magic.parser.format_usage().replace("::", "").strip()  # the parser writes reST
            raise UsageError(f"{e}\nusage: {usage}\n(%{magic.__name__}? documents every option)") from None


def _without_comment(line: str) -> str:
    """The magic's line less a trailing ``# comment``, as in Python (a ``#`` inside quotes stays)."""
    try:
        return shlex.join(shlex.split(line, comments=True))
    except ValueError:  # an unclosed quote: the parser says what is wrong with the line as written
        return line


class _LiveView:
    """The live panel's two outputs: a caption, and the widgets.

    When the cell ends, the caption becomes a one-line summary and the widgets
    become the report, in place (so the report sits above the cell's own output).
    """

    def __init__(self, session: Session) -> None:
        from perfmagic.render.live import LivePanel

        self.panel = LivePanel(session)
        self._closed = False
        # Shown while the cell runs, so that a kernel that dies still leaves the way back to its record.
        recovery = (
            f"recording to {session.outdir}; if the kernel dies, perfmagic.load({str(session.outdir)!r})"
        )
        caption = f"perfmagic: profiling this cell… ({recovery})"
        try:
            self._caption = display(
                {
                    "text/plain": caption,
                    "text/html": '<div style="font-size:12px">perfmagic: profiling this cell… '
                    f'<span style="color:#777">({html.escape(recovery)})</span></div>',
                },
                raw=True,
                display_id=True,
            )
            self._panel = display(self.panel.widget, display_id=True)
        except BaseException:
            self.panel.close()
            raise

    def close(
        self,
        report: Report | None,
        error: str | None,
        bundle: dict[str, str] | None = None,
        summary: dict[str, str] | None = None,
    ) -> None:
        """The caption becomes ``summary`` (by default, the report's in one line), the panel ``bundle``;
        then the widgets close; once.

        In that order: the browser drops the widgets' views before their models close, and the
        saved notebook holds no view of a model that only the kernel had.
        """
        from perfmagic.render.notebook import finished_bundle

        if self._closed:
            return
        self._closed = True
        self.panel.freeze()
        try:
            summary = summary or finished_bundle(report.to_dict() if report is not None else None, error)
            if self._caption is not None:
                self._caption.update(summary, raw=True)
            if self._panel is not None:
                self._panel.update(bundle or {"text/plain": ""}, raw=True)
        finally:
            self.panel.close()


def _href(path: Path) -> str:
    """A link the notebook can follow: relative to the kernel's directory when inside it."""
    full, here = path.resolve(), Path.cwd().resolve()
    return full.relative_to(here).as_posix() if full.is_relative_to(here) else str(full)


def load_ipython_extension(ipython: Any) -> None:
    ipython.register_magics(PerfMagics)
    _drop_syntax_check(ipython)
    ipython.input_transformers_cleanup.append(syntax_check(ipython))


def unload_ipython_extension(ipython: Any) -> None:
    magics = ipython.magics_manager.registry.get("PerfMagics")
    if magics is not None:
        magics.stop_monitor()
    _drop_syntax_check(ipython)


def _drop_syntax_check(ipython: Any) -> None:
    transforms = ipython.input_transformers_cleanup
    transforms[:] = [t for t in transforms if not getattr(t, "perfmagic", False)]


def _cell_number(shell: Any, body: str) -> int:
    """The execution count of the cell this magic runs in: IPython 9 counts a cell before running it
    (``execution_count`` is then the next cell's), IPython 8 after; the input history has it either way."""
    history = getattr(getattr(shell, "history_manager", None), "input_hist_raw", None) or []
    last = history[-1] if history else ""
    if body.strip() and isinstance(last, str) and body.strip() in last:  # this cell's own entry
        return len(history) - 1
    return int(shell.execution_count)
