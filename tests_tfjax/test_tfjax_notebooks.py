"""The Keras and JAX example notebooks, run on a real kernel of this venv."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from test_notebooks import executed, outputs_of  # tests/e2e/test_notebooks.py: the same run and checks

pytestmark = pytest.mark.tfjax

FRAMEWORK = {"keras.ipynb": "tensorflow", "jax.ipynb": "jax"}


@pytest.mark.parametrize("name", sorted(FRAMEWORK))
def test_example_notebook_shows_input_bound_and_the_fix_runs_faster(name: str, tmp_path: Path) -> None:
    nb, profiled = executed(name, tmp_path)
    assert len(profiled) == 2
    shown = []
    for cell in profiled:
        (report,) = [o for o in outputs_of(cell) if "pm-report" in o["data"].get("text/html", "")]
        html = report["data"]["text/html"]
        assert "Stage waterfall" in html
        assert report["data"]["text/plain"].startswith(f"perfmagic report (live, {FRAMEWORK[name]}")
        shown.append(set(re.findall(r'data-advice-id="([a-z_]+)"', html)))
    assert "input_bound" in shown[0], shown
    compare = next(c for c in nb.cells if c.source.startswith("%gpuprofile --compare"))
    (out,) = outputs_of(compare)
    speedup = re.search(r"\(([\d.]+)x faster\)", out["data"]["text/plain"])
    assert speedup and float(speedup.group(1)) > 1.3, out["data"]["text/plain"]
    print(name, out["data"]["text/plain"])
