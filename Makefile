# Two commands for a fresh machine: `make demo` and `make test`.
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install demo test test-fast lint typecheck lab browser gpu-check clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q -U pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

demo: install
	$(VENV)/bin/perfmagic demo

lint: install
	$(VENV)/bin/ruff check perfmagic tests benchmarks
	$(VENV)/bin/ruff format --check perfmagic tests benchmarks

typecheck: install
	$(VENV)/bin/mypy

# Debian's Chromium for the real-browser tests (Playwright drives it; no browser download).
browser:
	command -v chromium >/dev/null || (apt-get update -q && apt-get install -y -q chromium)

test: install browser lint typecheck
	$(VENV)/bin/pytest

# Everything but the slow groups (real kernels, notebooks, browsers): for quick iterations.
test-fast: install
	$(VENV)/bin/pytest -m "not slow"

lab: install
	$(VENV)/bin/jupyter lab

clean:
	rm -rf $(VENV) build dist perfmagic/labextension

# On a GPU machine, in one go and under 5 minutes: `pytest -m gpu`, a real CUDA training loop under
# perfmagic.profile(), the sampler's cost with real NVML, and a summary.
gpu-check: install
	$(PY) benchmarks/gpu_check.py
