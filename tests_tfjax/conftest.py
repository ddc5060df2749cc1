"""The TensorFlow/Keras and JAX tests: run in their own venv (``make test-tfjax``), never by the main suite."""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's start-up banners, not its errors
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # report_checks, paths
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "e2e"))  # test_notebooks
