"""Coverage-guided fuzzing (atheris, libFuzzer) of every parser that takes bytes from a peer.

    .venv/bin/python -m tests.fuzz --inputs 1000000          # `make fuzz`: the whole campaign, with its totals
    .venv/bin/python -m tests.fuzz --inputs 20000             # the slice the test suite runs
    .venv/bin/python -m tests.fuzz --target offer --inputs N  # one target

Each target (tests/fuzz/targets.py) runs in a process of its own, seeded with real messages, and fails on any
exception other than the parser's own typed rejection (a crash), on any one input that takes more than 100 ms of
CPU (a hang: measured as CPU time, so that a busy machine does not fake one), or past libFuzzer's RSS limit. The
BLE stateful fuzzer (tests/ble_fuzz.py, a mutation fuzzer of the GATT write path across links) runs as one more
target with its share of the inputs.
"""
