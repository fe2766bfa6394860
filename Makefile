# The two Quickstart commands. `make run` sets up and runs perfmodel's main job; `make test` sets up and runs the
# whole test suite (CI calls it through .ci/run).
VENV ?= .venv
export PERFMODEL_VENV := $(VENV)

.PHONY: setup run test bench

setup:
	@bash scripts/setup.sh

run: setup
	$(VENV)/bin/perfmodel profile resnet18 --batch-size 8

test: setup
	$(VENV)/bin/python -m pytest -q

bench: setup
	$(VENV)/bin/python bench/profile_cost.py
