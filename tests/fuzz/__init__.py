"""Coverage-guided fuzzing (atheris, libFuzzer) of every parser that takes bytes from a peer.

    .venv/bin/python -m tests.fuzz --inputs 1000000          # `make fuzz`: the whole campaign, with its totals
    .venv/bin/python -m tests.fuzz --replay --inputs 5000     # what the test suite runs: the corpus, a fixed seed
    .venv/bin/python -m tests.fuzz --target offer --inputs N  # one target
    .venv/bin/python -m tests.fuzz --inputs N --grow-corpus   # also keep what widened coverage in the corpus

Each target (tests/fuzz/targets.py) runs in a process of its own. The campaign starts from real messages and the
committed corpus (tests/fuzz/corpus/<target>/), and fails on any exception other than the parser's own typed
rejection (a crash), on any one input that takes more than 100 ms of CPU (a hang: measured as CPU time, so that a
busy machine does not fake one), or past libFuzzer's RSS limit; each failing input is added to the corpus. The replay
runs the corpus and a fixed seed's mutations with no time bound, so that it is the same test every run. The BLE
stateful fuzzer (tests/ble_fuzz.py, a mutation fuzzer of the GATT write path across links, seeded) runs as one more
target with its share of the inputs.
"""
