"""Where the test suite's files are, for tests in any of its folders."""

from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
SCRIPTS = TESTS / "scripts"
DATA = TESTS / "data"
EXAMPLES = REPO / "example_notebooks"
BENCHMARKS = REPO / "benchmarks"
