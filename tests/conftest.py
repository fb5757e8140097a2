"""Shared test machinery: async tests under Trio, and the `docker`, `netns` and `interop` markers' skip-or-fail rule.

- An `async def test_...` runs under `trio.run` (a tiny stand-in for pytest-trio, which the project does not use).
- A test marked `@pytest.mark.docker` needs a reachable daemon and the sandbox image with user 65534. Without
  them it is SKIPPED with the reason, unless EDGECODER_REQUIRE_DOCKER=1 (CI), where it FAILS instead.
- A test marked `@pytest.mark.netns` needs root, iproute2 and iptables to build network namespaces (tests/netns/).
  Without them it is SKIPPED with the reason, unless EDGECODER_REQUIRE_NETNS=1 (CI), where it FAILS instead.
- A test marked `@pytest.mark.interop` needs Node.js 20+ and the js-libp2p peer's packages (`npm ci` in
  tests/interop/js). Without them it is SKIPPED with the reason, unless EDGECODER_REQUIRE_INTEROP=1 (CI), where it
  FAILS instead.
- A test marked `@pytest.mark.gvisor` needs what a docker test needs, and the daemon's `runsc` runtime registered
  with the gVisor tier's arguments (scripts/setup.sh does it: executor/backends/registration.py). Without it, it is
  SKIPPED with the reason, unless EDGECODER_REQUIRE_GVISOR=1 (CI), where it FAILS instead.
"""

from __future__ import annotations

import functools
import inspect
import os
import tempfile
import uuid
from collections.abc import Iterator
from typing import Any

import docker
import docker.errors
import pytest
import requests
import trio
from hypothesis import settings

from executor.container_config import NODE_LABEL
from executor.policy import DEFAULT_IMAGE
from simulations.docker_relay import sweep_containers
from tests.interop.jspeer import interop_problem
from tests.netns.topology import netns_problem as _probe_netns

# Hypothesis states properties, never speed: its default deadline (200 ms per example) is a wall-clock bound that a
# loaded 2-core machine breaks at random (a slow example is reported as a failure, then passes on replay). Loaded
# here, before any test module builds its own settings, so every @settings inherits deadline=None.
settings.register_profile("edgecoder", deadline=None)
settings.load_profile("edgecoder")

# `timings` and `code` for the network-namespace modules (tests/netns/fixtures.py); a module's own fixture of the
# same name, or a parameter, takes precedence.
pytest_plugins = ["tests.netns.fixtures"]

# Nodes started by tests (in process or as CLI processes, which inherit it) keep their lock and replay journal
# in a directory of the test run, never in the developer's ~/.local/state.
os.environ.setdefault("EDGECODER_STATE_DIR", tempfile.mkdtemp(prefix="edgecoder-test-state-"))

_docker_problem: str | bool | None = False  # False: not checked yet; None: available; str: why not


def docker_problem() -> str | None:
    """Why docker tests cannot run here, or None when they can. Checked once per session."""
    global _docker_problem
    if _docker_problem is False:
        _docker_problem = _check_docker()
    assert _docker_problem is not False and _docker_problem is not True
    return _docker_problem


def _check_docker() -> str | None:
    image = os.environ.get("EDGECODER_IMAGE") or DEFAULT_IMAGE
    try:
        api = docker.APIClient(**docker.utils.kwargs_from_env(), timeout=10)
    except (docker.errors.DockerException, requests.RequestException, OSError) as exc:
        return f"no Docker daemon reachable ({exc})"
    with api:  # closed, so that ResourceWarning can be an error in the tests
        try:
            api.ping()
        except (docker.errors.DockerException, requests.RequestException, OSError) as exc:
            return f"no Docker daemon reachable ({exc})"
        try:
            user = (api.inspect_image(image).get("Config") or {}).get("User")
        except docker.errors.ImageNotFound:
            return f"sandbox image {image} missing: run `python -m executor.images build`"
    if user not in ("65534", "65534:65534"):
        return f"sandbox image {image} has user {user!r}, not 65534:65534: rebuild it"
    return None


_gvisor_problem: str | bool | None = False  # False: not checked yet; None: available; str: why not


def gvisor_problem() -> str | None:
    """Why gVisor tests cannot run here, or None when they can. Checked once per session."""
    global _gvisor_problem
    if _gvisor_problem is False:
        _gvisor_problem = docker_problem() or _check_gvisor()
    assert _gvisor_problem is not False and _gvisor_problem is not True
    return _gvisor_problem


def _check_gvisor() -> str | None:
    from executor.backends.gvisor import GvisorBackend

    try:
        with docker.APIClient(**docker.utils.kwargs_from_env(), timeout=10) as api:
            info = api.info()
    except (docker.errors.DockerException, requests.RequestException, OSError) as exc:
        return f"no Docker daemon reachable ({exc})"
    return GvisorBackend().daemon_problem(info)


_netns_problem: str | bool | None = False  # False: not checked yet; None: available; str: why not


def netns_problem() -> str | None:
    """Why netns tests cannot run here, or None when they can. Tried once per session (a namespace, a veth, the
    iptables matches the harness uses), then undone."""
    global _netns_problem
    if _netns_problem is False:
        found = _probe_netns()
        _netns_problem = None if found is None else f"needs root and iproute2/iptables: {found}"
    assert _netns_problem is not False and _netns_problem is not True
    return _netns_problem


# Modules whose tests take seconds each (real meshes, simulations, namespaces, fuzzing, BLE over HCI): `slow`, so
# that `make quick` (`pytest -m "not slow and not docker and not netns and not interop"`) stays an inner loop.
SLOW_MODULES = frozenset(
    {
        "test_simulations",
        "test_netns_mesh",
        "test_netns_swarm",
        "test_netns_harness",
        "test_ble_fuzz",
        "test_fuzz_slice",
        "test_ble_hci_process",
        "test_hardening_yamux",
        "test_hardening_shutdown",
        "test_interop_js",
    }
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        # A test that asks for the daemon is a docker test, marked or not: `make quick` leaves it out, and the
        # skip-or-fail rule above applies to it.
        if "docker_api" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.docker)
        if item.module is not None and item.module.__name__.rsplit(".", 1)[-1] in SLOW_MODULES:  # type: ignore[attr-defined]
            item.add_marker(pytest.mark.slow)
    # The modules that wait on processes, containers and namespaces first, the quick pure ones last: `make unit`
    # (pytest-xdist, `--dist loadfile --no-loadscope-reorder`) hands out whole modules in this order, so that no
    # worker is left running a long module at the end while the others are idle. A module's tests stay together and
    # in their order (its module-scoped fixtures are set up once).
    weight: dict[str, int] = {}
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        weight[module] = min(weight.get(module, 2), _weight_of(item))
    items.sort(key=lambda item: weight[item.nodeid.split("::", 1)[0]])


def _weight_of(item: pytest.Item) -> int:
    if item.get_closest_marker("slow") is not None:
        return 0
    if any(item.get_closest_marker(m) is not None for m in ("netns", "docker", "gvisor", "interop")):
        return 1
    return 2


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("netns") is not None:
        skip_or_fail(netns_problem(), "EDGECODER_REQUIRE_NETNS")
    if item.get_closest_marker("docker") is not None:
        skip_or_fail(docker_problem(), "EDGECODER_REQUIRE_DOCKER")
    if item.get_closest_marker("gvisor") is not None:
        skip_or_fail(gvisor_problem(), "EDGECODER_REQUIRE_GVISOR")
    if item.get_closest_marker("interop") is not None:
        skip_or_fail(interop_problem(), "EDGECODER_REQUIRE_INTEROP")


def skip_or_fail(problem: str | None, required_by: str) -> None:
    """Skip with `problem`, or fail when `required_by` (an EDGECODER_REQUIRE_* variable that .ci/run sets) is 1: the
    only way a test of this suite may skip."""
    if problem is None:
        return
    if os.environ.get(required_by) == "1":
        pytest.fail(f"{required_by}=1 but {problem}", pytrace=False)
    pytest.skip(problem)


_skip_or_fail = skip_or_fail  # the name tests/test_isolation.py imports


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    arguments = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}
    trio.run(functools.partial(pyfuncitem.obj, **arguments))
    return True


@pytest.fixture(scope="session")
def docker_api() -> Iterator[docker.APIClient]:
    """A plain SDK client to the real daemon, for asserting what exists on it."""
    problem = docker_problem()
    if problem is not None:
        if os.environ.get("EDGECODER_REQUIRE_DOCKER") == "1":
            pytest.fail(problem, pytrace=False)
        pytest.skip(problem)
    api = docker.APIClient(**docker.utils.kwargs_from_env(), timeout=30)
    yield api
    api.close()


@pytest.fixture
def node_label(docker_api: docker.APIClient) -> Iterator[str]:
    """A node label unique to one test, so its container checks never see other tests' (or engineers') work."""
    label = f"test-{uuid.uuid4().hex[:12]}"
    yield label
    # Whatever the test asserted, leave nothing behind on the shared daemon.
    sweep_containers([label])


def containers_of(api: docker.APIClient, label: str) -> list[dict[str, Any]]:
    return api.containers(all=True, filters={"label": f"{NODE_LABEL}={label}"})
