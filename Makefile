# Two entry points for a fresh machine: `make all` (the AG News workflow) and
# `make test`. Both create .venv and install torch's CPU build first.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH := torch==2.13.0

.PHONY: all smoke test test-slow lint clean

$(BIN)/elmo-spacy: setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet $(TORCH)
	$(BIN)/pip install --quiet -e ".[test,plots]"
	touch $@

all: $(BIN)/elmo-spacy
	$(BIN)/python -m spacy project run all .

smoke: $(BIN)/elmo-spacy
	$(BIN)/python -m spacy project run smoke .

test: $(BIN)/elmo-spacy
	$(BIN)/python -m pytest -q

test-slow: $(BIN)/elmo-spacy
	$(BIN)/python -m pytest -q -m slow

lint: $(BIN)/elmo-spacy
	$(BIN)/ruff check elmo_spacy tests
	$(BIN)/ruff format --check elmo_spacy tests

clean:
	rm -rf $(VENV) corpus training metrics
