"""What perfmagic adds to starting and ending a Python process.

Every Python process ``perfmagic run`` profiles (a torchrun rank, a spawned worker) starts
perfmagic from its ``sitecustomize`` before the script's first line and finishes its record at
exit. Two scripts, ``pass`` and ``import torch``, each started three ways:

- **plain**: ``python -c SCRIPT``;
- **profiled process**: the same command with the environment ``perfmagic run`` gives its command
  (its ``sitecustomize`` first on ``PYTHONPATH``, a run directory): what each process pays;
- **perfmagic run**: ``perfmagic run --quiet -- python -c SCRIPT``, the whole run (start, the
  report, exit).

Each start is timed from ``Popen`` to the script's first line (it prints one before anything
else) and to the end, with the CPU seconds of all its processes. Ways are interleaved in each round; the medians over ``--runs`` rounds and
their excess over plain are printed. perfmagic's bytecode is compiled first, as ``pip install`` compiles
an installed package's: a checkout under ``PYTHONDONTWRITEBYTECODE=1`` would otherwise compile some 60
modules from source in every process, a cost no installed copy pays.

    python benchmarks/startup.py [--runs 10] [--json FILE]
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from perfmagic.children import INTERVAL_ENV, RUN_DIR_ENV, write_sitecustomize

ROOT = Path(__file__).resolve().parent.parent

SCRIPTS = {"pass": "pass", "import torch": "import torch"}
FIRST_LINE = "import sys; sys.stdout.write('first\\n'); sys.stdout.flush()\n"
PERFMAGIC = "import sys; from perfmagic.cli import main; sys.exit(main())"


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, float, float]:
    """Seconds from start to the command's first line of output and to its end, and the CPU seconds of
    the command and every process it started (which a loaded machine moves less than wall time)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    child = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert child.stdout is not None
    line = child.stdout.readline()
    first = time.perf_counter() - start
    child.stdout.read()
    if child.wait() != 0 or line != b"first\n":
        raise RuntimeError(f"{cmd} failed (exit {child.returncode}, first line {line!r})")
    end = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return first, end, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def ways(script: str, work: Path) -> dict[str, tuple[list[str], dict[str, str]]]:
    """The three ways to start ``script``: their commands and environments."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    code = FIRST_LINE + script
    boot = write_sitecustomize(work / "boot").parent
    profiled = {
        **env,
        "PYTHONPATH": os.pathsep.join([str(boot), str(ROOT)]),
        RUN_DIR_ENV: str(work),
        INTERVAL_ENV: "0.1",
    }
    run = [sys.executable, "-c", PERFMAGIC, "run", "--quiet", "--outdir", str(work / "run"), "--"]
    return {
        "plain": ([sys.executable, "-c", code], env),
        "profiled process": ([sys.executable, "-c", code], profiled),
        "perfmagic run": ([*run, sys.executable, "-c", code], env),
    }


def measure(runs: int) -> dict[str, dict[str, dict[str, float]]]:
    """Median seconds to the first line and to the end, by script and way."""
    results: dict[str, dict[str, dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="perfmagic-startup-") as tmp:
        for name, script in SCRIPTS.items():
            started = ways(script, Path(tmp) / name.replace(" ", "-"))
            times: dict[str, list[tuple[float, float, float]]] = {way: [] for way in started}
            for cmd, env in started.values():  # one unmeasured start each: the disk cache warm
                timed(cmd, env)
            for _ in range(runs):
                for way, (cmd, env) in started.items():
                    times[way].append(timed(cmd, env))
            results[name] = {
                way: {
                    "first_line_s": statistics.median(t[0] for t in ts),
                    "end_s": statistics.median(t[1] for t in ts),
                    "cpu_s": statistics.median(t[2] for t in ts),
                }
                for way, ts in times.items()
            }
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    compileall.compile_dir(ROOT / "perfmagic", quiet=1)
    results = measure(args.runs)
    for name, by_way in results.items():
        plain = by_way["plain"]
        print(f"python -c {name!r} (median of {args.runs})")
        for way, t in by_way.items():
            extra = (
                ""
                if way == "plain"
                else f"   (+{t['first_line_s'] - plain['first_line_s']:.3f} / "
                f"+{t['end_s'] - plain['end_s']:.3f} / +{t['cpu_s'] - plain['cpu_s']:.3f} s over plain)"
            )
            print(
                f"  {way:17} first line {t['first_line_s']:.3f} s, end {t['end_s']:.3f} s, "
                f"CPU {t['cpu_s']:.3f} s{extra}"
            )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
