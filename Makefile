# The two commands of the README. Both set up what is missing first, and are quick when nothing is.
.PHONY: demo test setup lint unit docs bench

VENV := .venv
BIN := $(VENV)/bin

demo: setup
	$(BIN)/edgecoder demo

test: setup lint unit docs

setup:
	@scripts/setup.sh

lint:
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

unit:
	$(BIN)/pytest

docs:
	@if [ -f mkdocs.yml ]; then NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet --site-dir /tmp/edgecoder-site; fi

bench: setup
	$(BIN)/python benchmarks/bench_executor.py
	$(BIN)/python benchmarks/bench_intake.py
	$(BIN)/python benchmarks/bench_startup.py
