"""``perfmagic run --trace 3 -- python keras_train.py``: an unchanged Keras script, on each backend."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.tfjax

SCRIPT = Path(__file__).parent / "scripts" / "keras_train.py"


@pytest.mark.parametrize("backend", ["tensorflow", "jax"])
def test_run_profiles_a_keras_script(backend: str, tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    env = {**os.environ, "KERAS_BACKEND": backend}
    command = [sys.executable, "-m", "perfmagic.cli", "run", "--trace", "3", "--json", str(out), "--"]
    result = subprocess.run(
        [*command, sys.executable, str(SCRIPT)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"trained on {backend}" in result.stdout  # the script's own output goes through
    report = json.loads(out.read_text())
    assert report["source"] == "run" and report["framework"] == backend
    assert report["trainer"] == "keras.Model.fit" and report["steps"]["count"] == 30
    (trace,) = report["torch_traces"]  # --trace: the backend's own profiler, for 3 steps
    assert trace["profiler"] == backend and trace["steps"] == 3 and Path(trace["path"]).is_file()
    if backend == "tensorflow":  # JAX's Keras may read batches on a thread of its own: see the README
        assert report["bottleneck"] == "data"
        card = next(c for c in report["advice"] if c["id"] == "input_bound")
        assert "num_parallel_calls=AUTOTUNE" in card["fix"]
