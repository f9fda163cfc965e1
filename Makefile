# graphopt developer entry points: `make demo` and `make test` work in a fresh clone with only python3.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m graphopt.demo

test: $(STAMP)
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) -m pip install --quiet -e '.[bench]'
	$(PY) bench/compile_time.py --compact --json out/compile_time.json
	$(PY) bench/latency.py --compact --json out/latency.json
	$(PY) bench/startup.py --json out/startup.json
	$(PY) bench/process_start.py --json out/process_start.json
	$(PY) bench/memory.py --json out/memory.json

clean:
	rm -rf $(VENV) build *.egg-info
