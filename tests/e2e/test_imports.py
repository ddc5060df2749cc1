"""Hooking torch when the profiled code imports it, and never importing it otherwise."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path


def run_python(code: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_torch_imported_inside_the_profiled_block_is_hooked() -> None:
    out = run_python(
        """
        import sys, perfmagic
        assert "torch" not in sys.modules
        with perfmagic.profile(sample=False) as session:
            import torch  # like a notebook cell that starts with its imports
            model = torch.nn.Linear(8, 1)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for _ in range(7):
                opt.zero_grad()
                model(torch.randn(4, 8)).sum().backward()
                opt.step()
        r = session.report
        print(r.to_dict()["framework"], r.steps["count"], sorted(r.stages))
        """
    )
    assert out == "torch 7 ['backward', 'forward', 'optimizer', 'other']"


def test_profiling_code_without_torch_does_not_import_it() -> None:
    out = run_python(
        """
        import sys, perfmagic
        with perfmagic.profile(sample=False) as session:
            sum(range(1000))
        print("torch" in sys.modules, session.report.steps["count"])
        """
    )
    assert out == "False 0"


def test_the_import_hook_is_gone_after_the_block() -> None:
    out = run_python(
        """
        import sys, perfmagic
        before = list(sys.meta_path)
        with perfmagic.profile(sample=False):
            pass
        print(sys.meta_path == before)
        """
    )
    assert out == "True"


def test_torch_imported_on_another_thread_hooks_the_profiled_thread() -> None:
    out = run_python(
        """
        import sys, threading, perfmagic
        before = list(sys.meta_path)
        with perfmagic.profile(sample=False) as session:
            loader = threading.Thread(target=lambda: __import__("torch"))  # a prefetching thread, say
            loader.start()
            loader.join()
            import torch
            model = torch.nn.Linear(8, 1)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for _ in range(5):
                opt.zero_grad()
                model(torch.randn(4, 8)).sum().backward()
                opt.step()
        print(session.report.steps["count"], torch.nn.Module.__call__.__qualname__, sys.meta_path == before)
        """
    )
    assert out == "5 Module._wrapped_call_impl True"


def test_trace_counts_the_training_threads_steps_when_torch_was_imported_elsewhere(tmp_path: Path) -> None:
    out = run_python(
        f"""
        import threading, perfmagic
        with perfmagic.profile(sample=False, trace=2, outdir={str(tmp_path)!r}) as session:
            loader = threading.Thread(target=lambda: __import__("torch"))
            loader.start(); loader.join()  # torch is imported, and hooked, on another thread
            import torch
            model = torch.nn.Linear(8, 1)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for _ in range(6):
                opt.zero_grad()
                model(torch.randn(4, 8)).sum().backward()
                opt.step()
        print([t["steps"] for t in session.report.to_dict()["torch_traces"]])
        """
    )
    assert out == "[2]"
