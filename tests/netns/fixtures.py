"""The fixtures every network-namespace test module uses: a topology torn down with its nodes' containers, the
scenario's timings, and the trivial task's code file. tests/conftest.py loads this module as a plugin, so `timings`
and `code` are fixtures everywhere; each module defines `net` on `topology`, so that it says what `net` needs."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from simulations.docker_relay import sweep_containers
from tests.netns.processes import NodeProcess
from tests.netns.timings import Timings
from tests.netns.topology import Topology

SUM = "import json, sys\nprint(sum(json.load(sys.stdin)['xs']))\n"


@contextmanager
def topology() -> Iterator[Topology]:
    """A topology, closed on the way out. Nodes stopped with SIGTERM remove their containers; one that had to be
    SIGKILLed may leave some on the shared daemon, swept by its label (its PeerID)."""
    net = Topology()
    try:
        yield net
    finally:
        try:
            net.close()
        finally:
            sweep_containers([p.peer_id for p in net.processes if isinstance(p, NodeProcess) and p.is_ready])


@pytest.fixture
def timings(request: pytest.FixtureRequest) -> Iterator[Timings]:
    recorded = Timings(request.node.name)
    yield recorded
    recorded.flush()


@pytest.fixture
def code(tmp_path: Path) -> Path:
    path = tmp_path / "sum.py"
    path.write_text(SUM)
    return path
