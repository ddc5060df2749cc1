"""`pip install perfmagic` as a user does it: the wheel, into a fresh venv, with no Node on PATH.

The wheel is built from this checkout (its sidebar built here, with Node when the build is stale); the
venv gets it plus JupyterLab and Notebook 7 from the package index, and nothing from the dev venv.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
from paths import REPO

pytestmark = pytest.mark.slow


CELL = """\
%%gpuprofile -v report   # a trailing comment, as users write them
import time
import perfmagic
for _ in range(20):
    time.sleep(0.01)
    perfmagic.step()
"""


def _clean_env(tmp: Path, venv: Path) -> dict[str, str]:
    """Only the venv's bin on PATH (so no Node), no PYTHONPATH, Jupyter's directories in ``tmp``."""
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV"}}
    env["PATH"] = str(venv / "bin")
    for name in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR", "IPYTHONDIR"):
        (tmp / name).mkdir(exist_ok=True)
        env[name] = str(tmp / name)
    return env


def test_wheel_installs_everything_without_node(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(REPO)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert build.returncode == 0, build.stderr[-3000:]
    (wheel,) = dist.glob("perfmagic-*.whl")

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    env = _clean_env(tmp_path, venv)
    assert shutil.which("node", path=env["PATH"]) is None
    begin = time.monotonic()
    install = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "-q", str(wheel), "jupyterlab>=4,<5", "notebook>=7"],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert install.returncode == 0, install.stderr[-3000:]
    print(f"pip install of the wheel, JupyterLab and Notebook: {time.monotonic() - begin:.0f} s")

    def jupyter(*args: str) -> str:
        done = subprocess.run(
            [str(venv / "bin" / "jupyter"), *args], env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return re.sub(r"\x1b\[[0-9;]*m", "", done.stdout + done.stderr)

    labext = jupyter("labextension", "list")
    assert re.search(r"perfmagic v\S+ enabled OK", labext), labext
    serverext = jupyter("server", "extension", "list")
    assert re.search(r"perfmagic\.server enabled", serverext), serverext

    version = subprocess.run(
        [str(venv / "bin" / "perfmagic"), "--version"], env=env, capture_output=True, text=True, timeout=60
    )
    assert version.returncode == 0 and re.fullmatch(r"perfmagic \d+\.\d+\.\d+\S*\n", version.stdout)

    nb = nbformat.v4.new_notebook()
    nb.metadata.kernelspec = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [
        nbformat.v4.new_code_cell("%load_ext perfmagic"),
        nbformat.v4.new_code_cell(CELL),
        nbformat.v4.new_code_cell(
            "import sys, perfmagic; print(sys.prefix); print(perfmagic.__file__); "
            "print(report.to_dict()['steps']['count'])"
        ),
    ]
    path = tmp_path / "check.ipynb"
    nbformat.write(nb, path)
    jupyter("nbconvert", "--to", "notebook", "--execute", "--inplace", str(path))
    done = nbformat.read(path, as_version=4)
    errors = [o for c in done.cells for o in c.outputs if o.output_type == "error"]
    assert not errors, errors
    report = [o for o in done.cells[1].outputs if "pm-report" in json.dumps(o.get("data", {}))]
    assert report, done.cells[1].outputs
    prefix, module, steps = done.cells[2].outputs[0]["text"].split()
    assert Path(prefix) == venv and Path(module).is_relative_to(venv)  # the wheel, not this checkout
    assert int(steps) >= 19
