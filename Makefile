# `make demo` and `make test` each create .venv if missing and install the pinned requirements.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-all install docs lane lane-status lane-checkpoint clean

# the pins, then this checkout as the editable package `lpmetrics` (pyproject.toml; --no-deps: the
# pins above are the dependencies, --no-build-isolation: the pinned setuptools builds it offline)
$(STAMP): requirements.txt requirements-nodeps.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps -r requirements-nodeps.txt
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) -m scripts.demo

# two worker processes of one torch thread each: on a 2-core machine the suite takes about half
# the wall time of one process (325 s against 629 s here); TEST_WORKERS=0 runs it in one process
TEST_WORKERS ?= 2
test: $(STAMP)
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(PY) -m pytest -n $(TEST_WORKERS)

test-all: $(STAMP)
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(PY) -m pytest -n $(TEST_WORKERS) -m ""

# the API reference, rendered from the docstrings without importing the code (mkdocs.yml:
# mkdocstrings' griffe reads the source), warnings as errors, into site/ (ignored)
docs: $(STAMP)
	$(PY) -m mkdocs build --strict --site-dir site

# the CPU lane of the campaign (docs/reproducing.md): the headline cells' runs, one per core, in the
# background (it outlives this make; run folders under ~/lpmetrics_lane); lane-status shows them;
# lane-checkpoint makes each running training write last.pt now and go on (before a session ends)
lane: $(STAMP)
	$(PY) -m scripts.campaign cpu start --background

lane-status: $(STAMP)
	$(PY) -m scripts.campaign cpu status

lane-checkpoint: $(STAMP)
	$(PY) -m scripts.campaign cpu checkpoint

clean:
	rm -rf outputs multirun .pytest_cache site
