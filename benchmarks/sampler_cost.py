"""What the telemetry sampler costs: CPU of its thread, as a share of one core.

Runs the sampler at 10 Hz (by default) for a while in each configuration and reads
the sampler thread's own CPU time (``time.thread_time()`` on that thread):

- ``host``: the psutil host and process-tree source alone;
- ``host+nvml``: with the real NVML (skipped where NVML is unavailable);
- ``host+fake-nvml-2gpu``: with the test suite's fake NVML and two GPUs, which measures
  perfmagic's own Python path through NVML (the driver's time is not in it).

Usage: ``python benchmarks/sampler_cost.py [--seconds 20] [--hz 10]``. Target: < 1%.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from perfmagic.collect import nvml, nvml_query
from perfmagic.collect.host import HostSource
from perfmagic.collect.sampler import Sampler, Source
from perfmagic.collect.sources import default_sources
from perfmagic.timeline import Timeline


def measure(sources: list[Source], seconds: float, hz: float) -> dict[str, Any]:
    """Run a sampler; return its thread's CPU share of one core and its tick count."""
    cpu: list[float] = []
    timeline = Timeline()
    origin = time.perf_counter()
    sampler = Sampler(
        timeline,
        sources,
        interval=1.0 / hz,
        clock=lambda: time.perf_counter() - origin,
        on_tick=lambda: cpu.append(time.thread_time()),
    )
    sampler.start()
    time.sleep(seconds)
    sampler.stop()
    # thread_time() is per thread: first and last tick bracket the sampler thread's own work
    ticks = len(cpu) - 1
    span = ticks / hz
    return {
        "ticks": sampler.ticks,
        "cpu_pct_of_core": 100.0 * (cpu[-1] - cpu[0]) / span if ticks > 0 else float("nan"),
        "ms_per_tick": 1000.0 * (cpu[-1] - cpu[0]) / ticks if ticks > 0 else float("nan"),
        "metrics": len(timeline.metrics),
        "warnings": sampler.warnings,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--hz", type=float, default=10.0)
    args = parser.parse_args(argv)

    configs: list[tuple[str, Any]] = [("host", lambda: [HostSource()])]
    try:
        nvml.Nvml.open().close()
    except nvml_query.NvmlUnavailable as e:
        print(f"host+nvml: skipped, NVML unavailable ({e})")
    else:
        configs.append(("host+nvml", default_sources))
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    import fake_nvml

    def with_fake() -> list[Source]:
        fake = fake_nvml.two_gpus()
        nvml_query._load_pynvml = lambda: fake  # type: ignore[assignment]
        return default_sources()

    configs.append(("host+fake-nvml-2gpu", with_fake))

    print(f"sampler at {args.hz:g} Hz for {args.seconds:g} s per configuration")
    print(f"{'configuration':<22} {'ticks':>6} {'metrics':>8} {'ms/tick':>8} {'CPU % of one core':>18}")
    worst = 0.0
    for name, make in configs:
        r = measure(make(), args.seconds, args.hz)
        worst = max(worst, r["cpu_pct_of_core"])
        print(
            f"{name:<22} {r['ticks']:>6} {r['metrics']:>8} {r['ms_per_tick']:>8.3f} {r['cpu_pct_of_core']:>17.2f}%"
        )
    print(f"worst: {worst:.2f}% of one core (target < 1%)")
    return 0 if worst < 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
