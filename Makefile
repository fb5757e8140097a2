# The two commands of the README. Both set up what is missing first, and are quick when nothing is.
.PHONY: demo test setup lint unit quick docs bench fuzz

VENV := .venv
BIN := $(VENV)/bin

demo: setup
	$(BIN)/edgecoder image build --runtime python-science --if-missing
	$(BIN)/edgecoder demo

# The docs' strict build is a test of its own (tests/test_docs.py), so `make test` does not build them twice.
test: setup lint unit

setup:
	@scripts/setup.sh

lint:
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# The suite in two passes. First everything but the network-namespace and js-interop scenarios, over one
# pytest-xdist worker per core; a worker takes a whole module at a time (`loadfile`), so a module's shared set-up (a
# coordinator, a BLE node, a private dockerd) is made once, and tests/conftest.py orders the modules slow first.
# What these tests share is safe in parallel: containers carry a label per test, ports are picked free. Then the
# namespace and interop scenarios alone, in one process: each runs several nodes whose timings (a partition, a
# re-forming mesh) want the whole machine. Both passes run; `make unit` fails if either did. `make unit WORKERS=0`
# runs the first pass in one process too (docs/development.md).
WORKERS ?= auto
XDIST = $(if $(filter 0,$(WORKERS)),,-n $(WORKERS) --dist loadfile --no-loadscope-reorder)
SCENARIOS = netns or interop

unit:
	@status=0; \
	$(BIN)/pytest $(XDIST) -m "not ($(SCENARIOS))" || status=$$?; \
	$(BIN)/pytest -m "$(SCENARIOS)" || status=$$?; \
	exit $$status

# The developer's inner loop: no Docker, no namespaces, nothing slow.
quick:
	$(BIN)/pytest -q $(XDIST) -m "not slow and not docker and not netns and not interop"

docs:
	@if [ -f mkdocs.yml ]; then NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet --site-dir /tmp/edgecoder-site; fi

# Every benchmark, each printing "met" or "not met" per target; one whose run was broken (nothing admitted, no
# attacker, a failed run) exits 1, and `make bench` then fails after running the rest. benchmarks/sdk_floor.py and
# benchmarks/cli_baseline.py are parts of the others. tests/test_suite_rules.py checks that this list is complete.
BENCHMARKS := bench_executor bench_intake bench_startup bench_control bench_e2e bench_attacks bench_pubsub \
	bench_isolation bench_limits bench_node_start bench_rss bench_subset bench_sealed bench_runtimes bench_jobs \
	coordinator_growth
bench: setup
	@broken=""; for b in $(BENCHMARKS); do echo "== benchmarks/$$b.py"; \
		$(BIN)/python benchmarks/$$b.py || broken="$$broken $$b"; done; \
		if [ -n "$$broken" ]; then echo "broken runs:$$broken"; exit 1; fi

# Coverage-guided fuzzing of every parser that takes bytes from a peer: 1,000,000 inputs, with the totals. Every
# input that fails is added to tests/fuzz/corpus/, which `make test` replays (tests/test_fuzz_slice.py). Then the
# BLE mutation harness, 100,000 inputs per target (the suite runs 20,000: tests/test_ble_fuzz.py).
fuzz: setup
	$(BIN)/python -m tests.fuzz --inputs 1000000
	$(BIN)/python -m tests.ble_fuzz --inputs 100000
