# One set-up for everything: a pinned virtual environment in .venv and the system tools
# the course needs. `make test` and `make lab` work on a fresh Debian machine.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Graphviz's `dot` draws autograd graphs (notebook 07); tests render with it.
# Bubblewrap sandboxes student code when grading (`make autograde`).
SYSTEM_TOOLS := dot:graphviz bwrap:bubblewrap
# The browser tests drive Debian's Chromium with Playwright (no browser download); the
# PostgreSQL gradebook tests start Debian's server (tests/postgres_server.py finds initdb).
TEST_TOOLS := chromium:chromium pg_ctlcluster:postgresql npm:npm
# The JupyterHub class test's proxy: configurable-http-proxy from npm, at the versions of
# jupyter/hub/proxy/package-lock.json, in .venv/node (tests/hub.py finds it there).
PROXY := $(VENV)/node/node_modules/.bin/configurable-http-proxy
# A student's own copies of the notebooks (never the tracked course/), and where
# `make publish` writes the public repository's content.
WORK ?= work
PUBLIC ?= public
ROOT_FLAG = $$( [ "$$(id -u)" = 0 ] && echo --allow-root )

.PHONY: test tests check quick-tests lint lab instructor release publish autograde bench compare-stock classes integration verdicts fuzz faults bench-function-check gpu-check gpu-wheels lock system-tools test-tools hub-tools clean

# Lint runs beside the tests (mypy's minute on one core while the test workers start); a
# lint error fails the run when the tests end.
test: $(STAMP) system-tools test-tools
	$(MAKE) --no-print-directory -j2 lint tests

tests: $(STAMP)
	$(BIN)/python -m pytest

# Between commits (at most 5 minutes on two cores): lint beside the tests that need no
# browser, server, stock nbgrader, kernel or grading run (`-m "not slow"`: the unit tests, and
# each notebook's checks judged on its model solution and the first wrong answer of each exercise).
check: $(STAMP) system-tools
	$(MAKE) --no-print-directory -j2 lint quick-tests

quick-tests: $(STAMP)
	$(BIN)/python -m pytest -n 2 -m "not slow"

# Style (ruff), types (mypy, strict on the grader, the runner, the sandbox and the student
# package: pyproject.toml) and the trust boundary's imports (import-linter's contract).
lint: $(STAMP)
	$(BIN)/ruff check autograder tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports

# A student's JupyterLab: their own copies in $(WORK)/ (copied from course/ once: later
# releases add new notebooks and never overwrite a copy), no instructor panels
# (jupyter/student/). LAB_ARGS: extra options for jupyter lab, e.g. LAB_ARGS="--no-browser --port=8890".
lab: $(STAMP) system-tools
	@mkdir -p $(WORK)
	@for dir in course/*/; do slug=$$(basename $$dir); \
	  if [ -e $(WORK)/$$slug ]; then echo "keeping your $(WORK)/$$slug"; \
	  else cp -r $$dir $(WORK)/$$slug && echo "copied course/$$slug to $(WORK)/$$slug"; fi; done
	JUPYTER_CONFIG_PATH=$(CURDIR)/jupyter/student $(BIN)/jupyter lab --ServerApp.root_dir=$(WORK) $(ROOT_FLAG) $(LAB_ARGS)

# The instructor's JupyterLab on the course root (COURSE, by default this repository):
# formgrader (Nbgrader menu → Formgrader) and Create Assignment, on its gradebook
# (jupyter/instructor/). nbgrader reads nbgrader_config.py from the folder it starts in;
# without a shared exchange the course gets an exchange/ of its own, so formgrader has one.
COURSE ?= $(CURDIR)
instructor: $(STAMP) system-tools
	@[ -n "$$NBGRADER_EXCHANGE" ] || [ -d /srv/nbgrader/exchange ] || mkdir -p $(COURSE)/exchange  # nbgrader_config.py's
	cd $(COURSE) && PATH=$(CURDIR)/$(BIN):$$PATH JUPYTER_CONFIG_PATH=$(CURDIR)/jupyter/instructor \
	  $(CURDIR)/$(BIN)/jupyter lab --ServerApp.root_dir=$(COURSE) $(ROOT_FLAG) $(LAB_ARGS)

# Regenerate the student notebooks in course/ from solutions/ (stock nbgrader).
release: $(STAMP)
	$(BIN)/autograder release

# The public repository's content in $(PUBLIC)/ (a clone of it, or a new folder): the
# student package and the released notebooks, nothing of solutions/ or the grader.
# ARGS=--self-study: the edition for self-learners, with the quizzes' keys (never for a class).
publish: release
	$(BIN)/autograder publish $(PUBLIC) $(ARGS)

# Grade submitted/ (all assignments, all students; what is graded already is skipped).
# Pass options with ARGS, e.g. make autograde ARGS="03_function_basics --student alice --force".
autograde: $(STAMP) system-tools
	$(BIN)/autograder grade $(ARGS)

# Stock `nbgrader autograde` against `autograder grade` on a class batch of every notebook
# (ARGS go to it, e.g. ARGS="--students 30 --timeout 10"), then each notebook's Run-All time,
# then what grading costs per notebook, on a Dask cluster and on PostgreSQL (docs: README).
bench: $(STAMP) system-tools test-tools
	$(BIN)/python bench/stock_vs_engine.py $(ARGS)
	$(BIN)/python bench/run_all.py
	$(BIN)/python bench/scaling.py

# `autograder.check_function` against gradcheck + gradgradcheck and opcheck on every known
# answer of the exercises whose answer is a Function: the README's table (bench/results/).
bench-function-check: $(STAMP)
	$(BIN)/python bench/function_check_vs_stock.py $(ARGS)

# A thousand notebooks mutated at random in structure and metadata, graded beside honest
# students, and 500 hostile replies judged by the checks within the grader's bounds
# (tests/test_fuzz.py; `make test` runs a sample of each). FUZZ_SEED replays a run. It
# and compare-stock lift make test's 15-minute limit per test (--timeout 0).
FUZZ ?= 1000
FUZZ_REPLIES ?= 500
FUZZ_SEED ?= 20261127
fuzz: $(STAMP) system-tools
	$(BIN)/python -m pytest -n 0 --timeout 0 tests/test_fuzz.py --fuzz $(FUZZ) --fuzz-replies $(FUZZ_REPLIES) \
	  --fuzz-seed $(FUZZ_SEED)

# `make test` checks that the grader's verdicts are the kernel's on the model solutions and
# the first wrong answer of each exercise; this on every known answer, wrong and right.
verdicts: $(STAMP) system-tools
	$(BIN)/python -m pytest tests/test_verdicts.py --verdicts-all

# What people see and the servers a class runs on, each path whole: JupyterLab, formgrader and
# a hand-graded write-up in Chromium, a JupyterHub class, a PostgreSQL gradebook, a Dask cluster
# (its worker and scheduler killed mid-run: make faults). `make test` skips them.
integration: $(STAMP) system-tools test-tools hub-tools
	$(BIN)/python -m pytest -m integration --integration

# `make test` grades every known answer of notebook 03 (tests/grading.py's GRADED_WHOLE) end
# to end and a wrong and a right answer of each other exercise; this every answer of every
# notebook, and asks of each notebook that a wrong answer refutes every ✔ line its checks print.
classes: $(STAMP) system-tools
	$(BIN)/python -m pytest --timeout 0 tests/test_grading.py tests/test_hidden_inputs.py --classes-all

# `make test` kills the grader 5 times (2 at random moments, one at each step of a save);
# this 21 times (12 at random, each step at the first three saves), and a Dask worker and the
# scheduler mid-run.
faults: $(STAMP) system-tools
	$(BIN)/python -m pytest -n 0 tests/test_engine_faults.py tests/test_cluster.py --faults-all --integration

# `make test` compares the engine's scores with stock nbgrader's, and reads stock's feedback
# pages, on a sample covering every kind of graded cell (three notebooks); this on every
# known answer of every notebook (stock nbgrader: about 20 minutes).
compare-stock: $(STAMP) system-tools
	$(BIN)/python -m pytest --timeout 0 tests/test_engine_scores.py tests/test_grading.py --stock-all \
	  -k "stock_nbgraders or feedback_has_scores"

# The CUDA path, on a GPU machine whose python3 has torch and nothing else of ours (README,
# "Checking on a GPU"): most valuable first, within a time budget (ARGS="--budget 540", the
# default), one line per finished task, the report in $(GPU_OUT)/report.md and report.json
# rewritten after each. Here: make gpu-check PYTHON=.venv/bin/python (`make test` runs --quick).
GPU_OUT ?= bench/results/gpu-check
gpu-check:
	$(PYTHON) bench/gpu_check.py $(GPU_OUT) $(ARGS)

# What the GPU machine lacks for gpu-check's class batch, in build/gpu-check (carry it): the
# grader's wheels for its Python (ARGS="--python-version 3.12.3", the default) and Debian's bwrap.
gpu-wheels: $(STAMP)
	$(BIN)/python bench/gpu_grade.py --download $(ARGS)

$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV) || { \
	  echo "error: '$(PYTHON) -m venv' failed. On Debian/Ubuntu: apt-get install python3-venv"; exit 1; }
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[lab,grading,test]'
	@# An editable install is not byte-compiled, and workers never write bytecode (-B).
	$(BIN)/python -m compileall -q autograder
	@touch $@

# Pin every package of the environment (run after changing a version in pyproject.toml).
lock: $(STAMP)
	$(BIN)/python -m pip freeze --all --exclude-editable | grep -v '^pip==' | sed 's/+cpu$$//' > constraints.txt

# Install missing system tools with apt-get where possible, else say how to get them.
system-tools:
	$(call install_tools,$(SYSTEM_TOOLS))

test-tools:
	$(call install_tools,$(TEST_TOOLS))

hub-tools: $(PROXY)

$(PROXY): jupyter/hub/proxy/package.json jupyter/hub/proxy/package-lock.json | $(STAMP) test-tools
	mkdir -p $(VENV)/node && cp jupyter/hub/proxy/package.json jupyter/hub/proxy/package-lock.json $(VENV)/node/
	cd $(VENV)/node && npm ci --no-audit --no-fund --loglevel=error
	@touch $@

# $(1): tool:package pairs.
define install_tools
	@for pair in $(1); do \
	  tool=$${pair%%:*}; package=$${pair#*:}; \
	  command -v $$tool >/dev/null && continue; \
	  if command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then sudo=""; \
	  elif command -v apt-get >/dev/null && sudo -n true 2>/dev/null; then sudo="sudo"; \
	  else \
	    echo "error: '$$tool' was not found and cannot be installed automatically here."; \
	    echo "  Debian/Ubuntu: sudo apt-get install $$package"; \
	    echo "  macOS:         brew install $$package"; \
	    echo "  conda:         conda install -c conda-forge $$package"; \
	    echo "Then run make again."; exit 1; \
	  fi; \
	  echo "Installing $$package (for '$$tool') with apt-get"; \
	  $$sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq $$package >/dev/null || exit 1; \
	done
endef

clean:
	rm -rf $(VENV) .pytest_cache
