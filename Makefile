# `make demo` and `make test` each create .venv if missing and install the pinned requirements.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-all install clean

$(STAMP): requirements.txt requirements-nodeps.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps -r requirements-nodeps.txt
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) scripts/demo.py

test: $(STAMP)
	$(PY) -m pytest

test-all: $(STAMP)
	$(PY) -m pytest -m ""

clean:
	rm -rf outputs multirun .pytest_cache
