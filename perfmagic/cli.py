"""The ``perfmagic`` command: ``run``, ``report``, ``demo``."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from perfmagic.bootstrap import INTERVAL_ENV, RUN_DIR_ENV, TRACE_ENV, write_sitecustomize
from perfmagic.report import Report, report_from_timelines
from perfmagic.session import Session
from perfmagic.timeline import SPOOL_NAME, Timeline, TimelineFormatError


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "run":
        if not args.cmd:
            parser.error("run: give the command to profile after --, e.g. perfmagic run -- python train.py")
        return run(args)
    if args.command == "report":
        return report_traces(args)
    if args.command == "demo":
        from perfmagic.demo import main as demo_main

        return demo_main(steps=args.steps, json_path=args.json)
    parser.print_help()
    return 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="perfmagic", description="Find out why deep-learning training is slow."
    )
    sub = parser.add_subparsers(dest="command")

    run_p = sub.add_parser(
        "run",
        help="profile every Python process a command starts",
        description="Profile every Python process COMMAND starts (torchrun ranks included), "
        "with no change to its code, and print one report.",
    )
    _add_output_args(run_p)
    run_p.add_argument(
        "--trace",
        nargs="?",
        const=5,
        type=int,
        metavar="STEPS",
        help="also run torch.profiler in each process for STEPS training steps (default 5)",
    )
    run_p.add_argument(
        "--outdir",
        metavar="DIR",
        help="where the per-process records go (default: a new dir under ./perfmagic-out)",
    )
    run_p.add_argument(
        "--interval",
        type=_positive_float,
        default=0.1,
        metavar="S",
        help="hardware sampling interval (default 0.1 s)",
    )
    run_p.add_argument("--quiet", action="store_true", help="don't print the report")
    run_p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- COMMAND ...")

    report_p = sub.add_parser(
        "report",
        help="analyze traces that torch.profiler wrote",
        description="Analyze traces written by torch.profiler (one file per rank, .json or .json.gz) "
        "and print one report. Exit status 2 when a file is not a readable trace.",
    )
    _add_output_args(report_p)
    report_p.add_argument("traces", nargs="+", metavar="TRACE", help="a torch.profiler trace, one per rank")

    demo_p = sub.add_parser("demo", help="profile a built-in, deliberately input-bound training job")
    demo_p.add_argument("--steps", type=int, default=100, help="training steps (default 100)")
    demo_p.add_argument("--json", metavar="FILE", help="write the report as JSON")
    return parser


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


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def run(args: argparse.Namespace) -> int:
    cmd = args.cmd[1:] if args.cmd and args.cmd[0] == "--" else args.cmd
    outdir = Path(args.outdir) if args.outdir else Path("perfmagic-out") / time.strftime("run-%Y%m%d-%H%M%S")
    outdir.mkdir(parents=True, exist_ok=True)
    boot = write_sitecustomize(outdir / "boot").parent
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(boot.resolve()), *filter(None, [env.get("PYTHONPATH")])])
    env[RUN_DIR_ENV] = str(outdir.resolve())
    env[INTERVAL_ENV] = str(args.interval)
    if args.trace:
        env[TRACE_ENV] = str(args.trace)

    try:
        child = subprocess.Popen(cmd, env=env)
    except OSError as e:
        print(f"perfmagic run: cannot start {cmd[0]!r}: {e.strerror}", file=sys.stderr)
        return 127
    from perfmagic.collect.host import HostSource
    from perfmagic.collect.nvml import NvmlSource

    sampler = Session(
        interval=args.interval,
        outdir=outdir / "sampler",
        hooks=False,
        sources=[NvmlSource(), HostSource(root_pid=child.pid)],
        source="run",
    )
    # Ctrl-C reaches the whole process group: the command handles it; we wait for it to end.
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        try:
            sampler.start()
        except Exception as e:  # the command runs on, profiled by its own processes
            print(f"perfmagic run: no hardware sampling ({e})", file=sys.stderr)
        code = child.wait()
    finally:
        signal.signal(signal.SIGINT, previous)
        with contextlib.suppress(RuntimeError):  # "never started" when the start above failed
            sampler.stop()

    processes = _process_timelines(outdir)
    epoch = sampler.timeline.meta.get("epoch")
    for timeline in processes:  # one clock for all: the sampler's
        if epoch is not None and timeline.meta.get("epoch") is not None:
            timeline.rebase(epoch)
    report = report_from_timelines([sampler.timeline, *processes], source="run")
    report.save(outdir / "report.json")
    written = _write_outputs(report, args, "run")
    if not args.quiet:
        print(report)
        print(f"\nrecords and report.json in {outdir}", file=sys.stderr)
    return code if code or written else 1


def report_traces(args: argparse.Namespace) -> int:
    from perfmagic.trace_report import report_from_traces
    from perfmagic.traces import TraceFormatError

    try:
        report = report_from_traces(args.traces)
    except TraceFormatError as e:
        print(f"perfmagic report: {e}", file=sys.stderr)
        return 2
    print(report)
    return 0 if _write_outputs(report, args, "report") else 1


def _process_timelines(outdir: Path) -> list[Timeline]:
    timelines = []
    for spool in sorted(outdir.glob(f"proc-*/{SPOOL_NAME}")):
        try:
            timelines.append(Timeline.load(spool))
        except TimelineFormatError as e:
            print(f"perfmagic run: skipping an unreadable record: {e}", file=sys.stderr)
    return timelines


if __name__ == "__main__":
    sys.exit(main())
