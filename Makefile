# Two commands for a fresh machine: `make demo` and `make test`.
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install demo test test-unit test-e2e advice-matrix test-tfjax test-fast lint lint-ts typecheck cuda-coverage test-torch-min lab browser prometheus gpu-check clean

install: $(STAMP)

# The sidebar is TypeScript: installing builds it with npm (hatch-jupyter-builder), then links it
# into the venv so a rebuilt extension reaches the running lab.
$(STAMP): pyproject.toml labextension/package.json labextension/package-lock.json
	command -v npm >/dev/null || { echo "make install needs Node.js >= 20.19 and npm (the sidebar is TypeScript)"; exit 1; }
	# the lockfile's packages, devDependencies (ESLint, Prettier: make lint-ts) included; the build
	# hook below installs only when the built sidebar is older than its source
	cd labextension && npm ci --no-audit --no-fund
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q -U pip
	$(PY) -m pip install -q torch==2.13.0
	# torch named again: the frameworks must install against the pinned torch, never replace it
	$(PY) -m pip install -q -e '.[dev,frameworks]' torch==2.13.0
	$(VENV)/bin/jupyter-builder develop --overwrite .
	touch $@

demo: install
	$(VENV)/bin/perfmagic demo

lint: install
	$(VENV)/bin/ruff check perfmagic tests tests_tfjax benchmarks
	$(VENV)/bin/ruff format --check perfmagic tests tests_tfjax benchmarks

typecheck: install
	$(VENV)/bin/mypy

# The sidebar's TypeScript: Prettier and ESLint as labextension/package.json configures them, then tsc
# on the sources and on the node tests (whose fixtures must match the generated snapshot types).
lint-ts: install
	cd labextension && npm run lint:check && npx tsc --noEmit && npx tsc --noEmit -p tsconfig.test.json

# Debian's Chromium for the real-browser tests (Playwright drives it; no browser download).
browser:
	command -v chromium >/dev/null || (apt-get update -q && apt-get install -y -q chromium)

# Debian's Prometheus for the cluster-view tests (each test starts its own on 127.0.0.1, and stops it).
prometheus:
	command -v prometheus >/dev/null || (apt-get update -q && apt-get install -y -q --no-install-recommends prometheus)

# Every part runs whatever an earlier one returned (a failing TF/JAX test must not hide the main
# suite's results); the last line names the parts that failed, and the exit status is theirs.
TEST_PARTS := lint lint-ts typecheck cuda-coverage test-unit test-e2e test-tfjax
test: install browser prometheus
	@failed=""; for part in $(TEST_PARTS); do \
	  $(MAKE) --no-print-directory $$part || failed="$$failed $$part"; \
	done; \
	if [ -n "$$failed" ]; then echo "make test: FAILED:$$failed"; exit 1; fi; \
	echo "make test: every part passed ($(TEST_PARTS))"

# tests/unit: on a fake clock, no real time (seconds); tests/e2e: real loops, kernels, browsers.
test-unit: install
	$(VENV)/bin/pytest -q -p no:cacheprovider tests/unit

test-e2e: install
	$(VENV)/bin/pytest -p no:cacheprovider -m "not matrix" tests/e2e

# The advice matrix (benchmarks/advice_matrix.py): five loops profiled ten times each, ~2 min
advice-matrix: install
	$(VENV)/bin/pytest -p no:cacheprovider -m matrix -s tests/e2e

# The CUDA code runs on a simulated device here (tests/sim_cuda.py): every line of it must be run.
cuda-coverage: install
	$(VENV)/bin/pytest -q -p no:cacheprovider tests/e2e/test_cuda_sim.py \
	  --cov=perfmagic/collect --cov-report=term-missing --cov-fail-under=90

# TensorFlow/Keras and JAX (tests_tfjax/, the Keras and JAX notebooks) in a venv of their own: ~2 GB of
# frameworks whose numpy/protobuf pins stay apart from torch's. perfmagic comes from this checkout (a .pth
# file: the sidebar needs no second build). Install ~1 min, tests ~1.5 min here.
TFJAX := .venv-tfjax
TFJAX_STAMP := $(TFJAX)/.installed
TFJAX_DEPS := $(shell python3 -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
  print(' '.join(repr(d) for d in p['dependencies'] + p['optional-dependencies']['tfjax']))")
$(TFJAX_STAMP): pyproject.toml
	test -x $(TFJAX)/bin/python || python3 -m venv $(TFJAX)
	$(TFJAX)/bin/python -m pip install -q -U pip
	$(TFJAX)/bin/python -m pip install -q $(TFJAX_DEPS) 'pytest>=8' 'ipykernel>=6.29' 'nbclient>=0.10' 'nbformat>=5.10'
	echo $(CURDIR) > "$$($(TFJAX)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/perfmagic-src.pth"
	touch $@

test-tfjax: $(TFJAX_STAMP)
	$(TFJAX)/bin/pytest -q -p no:cacheprovider tests_tfjax

# Everything but the slow groups (real kernels, notebooks, browsers): for quick iterations.
test-fast: install
	$(VENV)/bin/pytest -m "not slow"

# The oldest torch the hooks support (pyproject's `torch` extra), in a venv of its own. Not part of
# `make test`: PyPI's Linux wheels of it bring their CUDA libraries, gigabytes to download.
TORCH_MIN := 2.1.2
test-torch-min:
	test -x .venv-torch-min/bin/python || python3 -m venv .venv-torch-min
	.venv-torch-min/bin/python -m pip install -q 'torch==$(TORCH_MIN)' 'numpy<2' -e '.[dev]'
	.venv-torch-min/bin/pytest -q -m "not browser" tests/e2e/test_stages_torch.py tests/e2e/test_torch_versions.py \
	  tests/e2e/test_compiled_models.py tests/e2e/test_cuda_sim.py tests/e2e/test_advice_e2e.py

lab: install
	cd labextension && PATH=$(CURDIR)/$(VENV)/bin:$$PATH npm run build
	$(VENV)/bin/jupyter lab $(if $(filter 0,$(shell id -u)),--allow-root)

clean:
	rm -rf $(VENV) .venv-torch-min $(TFJAX) build dist perfmagic/labextension

# On a GPU machine, in one go and under 5 minutes: `pytest -m gpu`, a real CUDA training loop under
# perfmagic.profile(), the sampler's cost with real NVML, and a summary (also in $OUT when set).
# It needs no Node and no Jupyter: a bare venv with the core dependencies does.
GPU_STAMP := $(VENV)/.gpu-installed
$(GPU_STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	timeout 900 $(PY) -m pip install -q torch==2.13.0 'numpy>=1.24' 'psutil>=5.9' 'nvidia-ml-py>=12.535' \
	  'nvtx>=0.2.10' 'msgspec>=0.18' 'pytest>=8' 'pytest-jupyter[server]>=0.10'
	touch $@

gpu-check: $(if $(wildcard $(STAMP)),,$(GPU_STAMP))
	timeout 360 $(PY) benchmarks/gpu_check.py
