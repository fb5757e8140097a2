# The two commands of the README. Both set up what is missing first, and are quick when nothing is.
.PHONY: demo test setup lint unit quick docs bench fuzz

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

# The developer's inner loop: no Docker, no namespaces, nothing slow (847 tests, under three minutes on two cores).
quick:
	$(BIN)/pytest -q -m "not slow and not docker and not netns and not interop"

docs:
	@if [ -f mkdocs.yml ]; then NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet --site-dir /tmp/edgecoder-site; fi

bench: setup
	$(BIN)/python benchmarks/bench_executor.py
	$(BIN)/python benchmarks/bench_intake.py
	$(BIN)/python benchmarks/bench_startup.py
	$(BIN)/python benchmarks/bench_control.py
	$(BIN)/python benchmarks/bench_e2e.py
	$(BIN)/python benchmarks/bench_attacks.py
	$(BIN)/python benchmarks/bench_pubsub.py
	$(BIN)/python benchmarks/bench_isolation.py

# Coverage-guided fuzzing of every parser that takes bytes from a peer: 1,000,000 inputs, with the totals. Every
# input that fails is added to tests/fuzz/corpus/, which `make test` replays (tests/test_fuzz_slice.py).
fuzz: setup
	$(BIN)/python -m tests.fuzz --inputs 1000000
