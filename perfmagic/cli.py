"""The ``perfmagic`` command: ``run``, ``report``, ``merge``, ``demo``."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from perfmagic import __version__
from perfmagic.children import FULL_ENV, INTERVAL_ENV, RUN_DIR_ENV, TRACE_ENV, TUNE_ENV, write_sitecustomize
from perfmagic.price import PRICE_ENV, gpu_hour_price

if TYPE_CHECKING:
    from perfmagic.report import Report


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "run":
        if not args.cmd or args.cmd == ["--"]:
            parser.error("run: give the command to profile after --, e.g. perfmagic run -- python train.py")
        return run(args)
    if args.command == "report":
        return report_traces(args)
    if args.command == "exporter":
        from perfmagic.exporter import main as exporter_main

        return exporter_main(args.address, args.port, args.hostname)
    if args.command == "merge":
        return merge(args)
    if args.command == "demo":
        from perfmagic.demo import main as demo_main

        return demo_main(steps=args.steps, json_path=args.json)
    parser.print_help()
    return 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="perfmagic", description="Find out why deep-learning training is slow."
    )
    parser.add_argument("--version", action="version", version=f"perfmagic {__version__}")
    sub = parser.add_subparsers(dest="command")
    _run_arguments(
        sub.add_parser(
            "run",
            help="profile every Python process a command starts",
            description="Profile every Python process COMMAND starts (torchrun ranks included), "
            "with no change to its code, and print one report.",
        )
    )
    _report_arguments(
        sub.add_parser(
            "report",
            help="analyze traces that torch.profiler or Nsight Systems wrote",
            description="Analyze traces written by torch.profiler (one file per rank, .json or .json.gz) "
            "or Nsight Systems captures (.sqlite from nsys export --type sqlite, or .nsys-rep with nsys on "
            "PATH); a directory: every trace in it. Print one report; with --compare, compare two. "
            "Exit status 2 when a file is not a readable trace.",
        )
    )
    exporter_p = sub.add_parser(
        "exporter",
        help="serve this machine's GPU and host metrics to Prometheus",
        description="Serve this machine's GPU metrics (under dcgm-exporter's names and labels) and host "
        "metrics at http://ADDRESS:PORT/metrics for Prometheus to scrape. Not meant to run beside "
        "dcgm-exporter on one machine (the same series twice).",
    )
    exporter_p.add_argument("--port", type=int, default=9410, help="port to listen on (default 9410)")
    exporter_p.add_argument(
        "--address", default="127.0.0.1", help="address to listen on (default 127.0.0.1; 0.0.0.0: every one)"
    )
    exporter_p.add_argument("--hostname", help="the Hostname label (default: this machine's host name)")
    merge_p = sub.add_parser(
        "merge",
        help="one job's report from several nodes' perfmagic run records",
        description="Build one job's report from the record directories (perfmagic run --outdir) of its "
        "nodes: every rank, the nodes' clocks aligned from the collectives their ranks left together. "
        "Exit status 2 when no directory holds a profiled process.",
    )
    _add_output_args(merge_p)
    merge_p.add_argument("--quiet", action="store_true", help="don't print the report")
    merge_p.add_argument("dirs", nargs="+", metavar="DIR", help="a node's perfmagic run record directory")

    demo_p = sub.add_parser("demo", help="profile a built-in, deliberately input-bound training job")
    demo_p.add_argument("--steps", type=int, default=100, help="training steps (default 100)")
    demo_p.add_argument("--json", metavar="FILE", help="write the report as JSON")
    return parser


def _run_arguments(run_p: argparse.ArgumentParser) -> None:
    """``perfmagic run``'s options: outputs, the framework's trace, tuning, records, sampling, COMMAND."""
    _add_output_args(run_p)
    run_p.add_argument(
        "--trace",
        nargs="?",
        const=5,
        type=_positive_int,
        metavar="STEPS",
        help="also run the framework's profiler (torch.profiler, TensorFlow's or JAX's) in each process for "
        "STEPS training steps (default 5)",
    )
    run_p.add_argument(
        "--tune",
        action="store_true",
        help="at the end of each training process, try more DataLoader workers and other thread counts on "
        "copies of what it trained, and put measured speed-ups on the cards",
    )
    run_p.add_argument(
        "--full",
        action="store_true",
        help="record every training step's stages (default: every step of the first 200 steps and 30 s, "
        "then 5 steps in every 53 or more; the step times of all steps)",
    )
    run_p.add_argument(
        "--tune-budget",
        type=_seconds(float("inf")),  # a time budget
        metavar="S",
        help="with --tune: seconds tuning may take per process (default: the smaller of 60 s and a quarter "
        "of the profiled time)",
    )
    run_p.add_argument(
        "--price-per-gpu-hour",
        type=float,
        metavar="PRICE",
        help=f"what one GPU costs for an hour (else ${PRICE_ENV}): the report adds cost per hour, per "
        "sample and per epoch, and what each card's change saves",
    )
    run_p.add_argument(
        "--outdir",
        metavar="DIR",
        help="where the per-process records go (default: a new dir under ./perfmagic-out)",
    )
    run_p.add_argument(
        "--interval",
        type=_seconds(60),  # a sampling interval
        default=0.1,
        metavar="S",
        help="hardware sampling interval (default 0.1 s)",
    )
    run_p.add_argument("--quiet", action="store_true", help="don't print the report")
    run_p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- COMMAND ...")


def _report_arguments(report_p: argparse.ArgumentParser) -> None:
    """``perfmagic report``'s options: outputs, the traces, and the two to compare."""
    _add_output_args(report_p)
    report_p.add_argument(
        "traces",
        nargs="*",
        metavar="TRACE",
        help="a torch.profiler trace or Nsight Systems capture (one per rank) or a directory of them",
    )
    report_p.add_argument(
        "--step-range",
        metavar="REGEX",
        help="Nsight Systems captures: the NVTX ranges whose text matches REGEX are the steps "
        "(default: ProfilerStep# ranges, else perfmagic's own stage ranges)",
    )
    report_p.add_argument(
        "--compare",
        nargs=2,
        metavar=("A", "B"),
        help="compare trace (or directory) A with B: steps, stages, GPU figures and kernels; "
        "--json writes the comparison",
    )


def _add_output_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", metavar="FILE", help="write the report as JSON")
    parser.add_argument("--html", metavar="FILE", help="write the report as a self-contained HTML file")


def _write_outputs(report: Report, args: argparse.Namespace, command: str) -> bool:
    """Write the report where ``--json`` and ``--html`` say; False, with a message, on a write error."""
    try:
        if args.json:
            report.to_json(args.json)
        if args.html:
            report.to_html(args.html)
    except OSError as e:
        print(f"perfmagic {command}: cannot write {e.filename}: {e.strerror}", file=sys.stderr)
        return False
    return True


def _seconds(at_most: float) -> Callable[[str], float]:
    """A parser of a positive, finite number of seconds, at most ``at_most``."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number of seconds, got {text!r}") from None
        if not 0 < value <= at_most or value == float("inf"):
            limit = f" and at most {at_most:g}" if at_most < float("inf") else ""
            raise argparse.ArgumentTypeError(f"must be a positive number of seconds{limit}, got {text}")
        return value

    return parse


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number of steps, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 step, got {text}")
    return value


NOTHING_PROFILED = 3
"""Exit status of ``perfmagic run`` when the command succeeded but none of its processes was profiled."""

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
"""Signals ``perfmagic run`` passes on to the command (as torchrun does to its workers)."""
_SI_USER = 0
"""``si_code`` of a signal another process sent with kill(); a terminal's Ctrl-C comes from the kernel
and reaches the command too (the same process group), so it is not sent again."""


def _exit_code(returncode: int) -> int:
    """The shell's convention: 128 + N for a command a signal N ended."""
    return 128 - returncode if returncode < 0 else returncode


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Hold the forwarded signals for :func:`_wait_forwarding` (Linux). Threads inherit the mask they are
    started with: held before the sampler's thread starts, a signal to perfmagic reaches the main
    thread's wait, never a thread whose default action would end perfmagic without passing it on."""
    if not hasattr(signal, "sigtimedwait"):
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
    try:
        yield
    finally:
        while signal.sigtimedwait(FORWARDED, 0) is not None:
            pass  # a Ctrl-C that came with the command's end was the command's: not ours to act on
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _wait_forwarding(child: subprocess.Popen[bytes]) -> int:
    """Wait for the command, passing on every signal sent to perfmagic; its exit code, shell-style.
    On Linux the signals must be held (:func:`_signals_held`)."""
    if not hasattr(signal, "sigtimedwait"):  # not Linux: Ctrl-C reaches the command's group; wait for it
        previous_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            return _exit_code(child.wait())
        finally:
            signal.signal(signal.SIGINT, previous_int)
    while child.poll() is None:
        info = signal.sigtimedwait(FORWARDED, 0.2)
        if info is not None and info.si_code == _SI_USER and child.poll() is None:
            child.send_signal(info.si_signo)
    return _exit_code(child.wait())


def _record_dir(wanted_dir: str | None) -> tuple[Path, Path]:
    """Where the run's records go, and the directory of the ``sitecustomize`` that starts profiling."""
    wanted = Path(wanted_dir) if wanted_dir else Path("perfmagic-out") / time.strftime("run-%Y%m%d-%H%M%S")
    try:
        wanted.mkdir(parents=True, exist_ok=True)
        return wanted, write_sitecustomize(wanted / "boot").parent
    except OSError as e:  # the command runs all the same, recorded elsewhere
        outdir = Path(tempfile.mkdtemp(prefix="perfmagic-run-"))
        print(
            f"perfmagic run: cannot write to {wanted} ({e.strerror}); recording in {outdir}", file=sys.stderr
        )
        return outdir, write_sitecustomize(outdir / "boot").parent


def _child_env(args: argparse.Namespace, boot: Path, outdir: Path, price: float | None) -> dict[str, str]:
    """The command's environment: what each of its Python processes' profiling reads."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(boot.resolve()), *filter(None, [env.get("PYTHONPATH")])])
    env[RUN_DIR_ENV] = str(outdir.resolve())
    env[INTERVAL_ENV] = str(args.interval)
    if args.trace:
        env[TRACE_ENV] = str(args.trace)
    if args.tune:
        env[TUNE_ENV] = str(args.tune_budget or "")
    if args.full:
        env[FULL_ENV] = "1"
    if price is not None:
        env[PRICE_ENV] = repr(price)
    return env


def run(args: argparse.Namespace) -> int:
    cmd = args.cmd[1:] if args.cmd and args.cmd[0] == "--" else args.cmd
    if args.tune_budget is not None and not args.tune:
        print("perfmagic run: --tune-budget sets how long --tune may take: add --tune", file=sys.stderr)
        return 2
    try:
        price = gpu_hour_price(args.price_per_gpu_hour)
    except ValueError as e:
        print(f"perfmagic run: {e}", file=sys.stderr)
        return 2
    outdir, boot = _record_dir(args.outdir)
    env = _child_env(args, boot, outdir, price)
    try:
        child = subprocess.Popen(cmd, env=env)
    except OSError as e:  # the shell's codes: 126 found but not runnable, 127 not found
        print(f"perfmagic run: cannot start {cmd[0]!r}: {e.strerror}", file=sys.stderr)
        return 126 if isinstance(e, PermissionError) or os.path.exists(cmd[0]) else 127
    # imported once the command is started: its first line does not wait for the sampler's code
    from perfmagic.collect.host import HostSource
    from perfmagic.collect.nvml_source import NvmlSource
    from perfmagic.session import Session

    sampler = Session(
        interval=args.interval,
        outdir=outdir / "sampler",
        hooks=False,
        children=False,  # the command's own environment profiles them
        sources=[NvmlSource(), HostSource(root_pid=child.pid)],
        source="run",
        price_per_gpu_hour=price,
    )
    with _signals_held():
        try:
            try:
                sampler.start()
            except Exception as e:  # the command runs on, profiled by its own processes
                print(f"perfmagic run: no hardware sampling ({e})", file=sys.stderr)
            # the report's code is imported while the command runs, not after it: the run ends sooner
            threading.Thread(target=_import_the_analysis, name="perfmagic-imports", daemon=True).start()
            code = _wait_forwarding(child)
        finally:
            with contextlib.suppress(RuntimeError):  # "never started" when the start above failed
                sampler.stop()

    from perfmagic.merge import node_report, read_node  # not before: the command starts sooner

    node = read_node(outdir, sampler=sampler.timeline)
    for warning in node.warnings:
        print(f"perfmagic run: {warning}", file=sys.stderr)
    if not node.processes:
        unseen = (
            "no Python process of the command was profiled: its Python lacks perfmagic (run the command "
            f"with the Python perfmagic is installed in, {sys.executable}, or activate that environment "
            "first), it runs no Python, or it runs Python isolated (python -I, -S or -E skip the "
            "sitecustomize perfmagic run starts profiling with)"
        )
        sampler.timeline.meta.setdefault("warnings", []).append(unseen)
    report = node_report(node)
    written = _write_outputs(report, args, "run")  # before anything is printed: a broken pipe loses nothing
    try:
        report.save(outdir / "report.json")
    except OSError as e:
        print(f"perfmagic run: cannot write {outdir / 'report.json'}: {e.strerror}", file=sys.stderr)
    if not args.quiet:
        print(report)
        print(f"\nrecords and report.json in {outdir}", file=sys.stderr)
    if not node.processes:  # last, so that it is what the terminal shows
        print(f"\nperfmagic run: NOTHING PROFILED. {unseen[0].upper()}{unseen[1:]}.", file=sys.stderr)
        return code or NOTHING_PROFILED
    return code if code or written else 1


def _import_the_analysis() -> None:
    with contextlib.suppress(Exception):  # imported again, its error shown, where the report is built
        import perfmagic.merge  # noqa: F401


def merge(args: argparse.Namespace) -> int:
    try:
        from perfmagic.merge import merge_records

        report = merge_records([Path(d) for d in args.dirs])
    except ValueError as e:
        print(f"perfmagic merge: {e}", file=sys.stderr)
        return 2
    written = _write_outputs(report, args, "merge")  # before printing: a broken pipe loses nothing
    if not args.quiet:
        print(report)
    return 0 if written else 1


def report_traces(args: argparse.Namespace) -> int:
    from perfmagic.heap import hold_mmap_threshold
    from perfmagic.trace_report import report_from_traces
    from perfmagic.traces import TraceFormatError

    hold_mmap_threshold()  # this process is the command's own: a large trace's freed arrays go back

    if bool(args.compare) == bool(args.traces) or (args.compare and args.html):
        print("perfmagic report: give traces, or --compare A B (with --json, not --html)", file=sys.stderr)
        return 2
    try:
        if args.compare:
            before, after = (report_from_traces([p], args.step_range) for p in args.compare)
        else:
            report = report_from_traces(args.traces, args.step_range)
    except TraceFormatError as e:
        print(f"perfmagic report: {e}", file=sys.stderr)
        return 2
    if not args.compare:
        written = _write_outputs(report, args, "report")  # before printing: a broken pipe loses nothing
        print(report)
        return 0 if written else 1
    comparison = before.compare(after)
    try:
        if args.json:
            Path(args.json).write_text(json.dumps(comparison.to_dict(), indent=1))
    except OSError as e:
        print(f"perfmagic report: cannot write {e.filename}: {e.strerror}", file=sys.stderr)
        return 1
    print(comparison)
    return 0


if __name__ == "__main__":
    sys.exit(main())
