# The two Quickstart commands. `make run` sets up and runs perfmodel's main job; `make test` sets up and runs the
# whole test suite (CI calls it through .ci/run).
VENV ?= .venv
export PERFMODEL_VENV := $(VENV)
# Python caches the bytecode of each module it imports, in .venv and the source tree, as it does by default: setup
# does not compile all 17,700 installed modules (33 s here) when a run imports about 6,600 of them, and pytest keeps
# its rewritten test modules. An environment that sets PYTHONDONTWRITEBYTECODE (this one does) would otherwise make
# every process compile whatever it imports, every time.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: setup setup-ray run test bench docs

setup:
	@bash scripts/setup.sh

# setup plus the optional `ray` extra (`perfmodel profile --ray`). CI installs it (.ci/run), so that the Ray tests
# (tests/profilers/test_ray_fanout.py) run there instead of skipping. pip installs it with setup's CPU pins
# (constraints-cpu.txt) where no GPU is seen, as scripts/setup.sh does: ~15 s on a fresh setup here, nothing once done
# (the stamp in the venv is newer than pyproject.toml and the constraints).
setup-ray: setup $(VENV)/.perfmodel-ray

$(VENV)/.perfmodel-ray: pyproject.toml constraints-cpu.txt
	@pins="-c constraints-cpu.txt"; \
	if command -v nvidia-smi >/dev/null 2>&1 || command -v rocm-smi >/dev/null 2>&1; then pins=; fi; \
	$(VENV)/bin/python -m pip install --quiet --disable-pip-version-check $$pins -e ".[ray]"
	@touch $@

# the service on its embedded default: the SQLite store under PERFMODEL_HOME (~/.perfmodel) and the shipped models,
# on 127.0.0.1:8000 (PERFMODEL_HOST / PERFMODEL_PORT and the other PERFMODEL_* settings change that)
run: setup
	$(VENV)/bin/perfmodel serve

# The suite runs next to a throwaway PostgreSQL server (scripts/with-postgres.sh installs Debian's postgresql when
# root and it is missing); where none can be started, the PostgreSQL tests skip and say why.
# pytest-xdist workers: one per core (one torch thread each; TEST_WORKERS=0 runs in one process). Each worker takes
# whole files, longest first (tests/conftest.py), so that module-scoped fixtures are built once; each has its own
# PostgreSQL database (tests/conftest.py). A third worker on this 2-core machine used to run while tests waited on
# their servers and child processes; they now wait ~13 s of a 6-minute single-process run, and a third worker costs
# more (a third interpreter compiling, collecting and starting a capture fork server; three processes on two cores
# take ~12 % more CPU each): 8 alternated fresh clones (bench/fresh_clone_test.sh) took 4:04 on average with two
# workers and 4:28 with three. PYTEST_ARGS adds pytest options (make test PYTEST_ARGS="-k api").
TEST_WORKERS ?= $(shell nproc 2>/dev/null || echo 1)
test: setup
	bash scripts/with-postgres.sh $(VENV)/bin/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=25 $(PYTEST_ARGS)

bench: setup
	$(VENV)/bin/python bench/service.py

# docs/accuracy.md and README.md's accuracy and speed tables, rendered from their templates (docs/accuracy.md.in,
# docs/readme-accuracy.md.in) and the figures the benches recorded (docs/figures/*.json: a bench run with `--record`
# rewrites its file); tests/docs fails while a render and its file differ
docs: setup
	$(VENV)/bin/python scripts/render_accuracy.py
