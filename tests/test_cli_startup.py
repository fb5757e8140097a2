"""What start-up imports: `edgecoder --help` and `keygen` must not pay for the stack the other commands use.

Import lists, not timings (benchmarks/bench_startup.py prints the times, side by side with `python -c pass`).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

HEAVY = (
    "trio",
    "structlog",
    "libp2p",
    "docker",
    "requests",
    "httpx",
    "starlette",
    "hypercorn",
    "bleak",
    "bumble",
    "prometheus_client",
    "mesh.coordinator.app",
    "mesh.coordinator.server",
    "mesh.node",
    "executor.runner",
)


def imported_after(code: str) -> list[str]:
    probe = f"{code}\nimport sys, json\nprint(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return list(json.loads(done.stdout.strip().splitlines()[-1]))


def test_importing_the_cli_imports_nothing_heavy() -> None:
    assert imported_after("import mesh.cli") == []


def test_help_and_keygen_import_nothing_heavy(tmp_path: Path) -> None:
    run = "from mesh import cli\ntry:\n    cli.run({argv!r})\nexcept SystemExit:\n    pass"
    assert imported_after(run.format(argv=["--help"])) == []
    assert imported_after(run.format(argv=["node", "--help"])) == []
    assert imported_after(run.format(argv=["keygen", "--out", str(tmp_path / "k")])) == []


def test_keygen_does_not_even_build_the_coordinator_group(tmp_path: Path) -> None:
    argv = ["keygen", "--out", str(tmp_path / "k")]
    probe = f"from mesh import cli\ntry:\n    cli.run({argv!r})\nexcept SystemExit:\n    pass\n"
    probe += "import sys\nprint('mesh.coordinator.cli' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip().splitlines()[-1] == "False"


def test_the_executor_package_and_its_contract_are_light() -> None:
    assert imported_after("import executor, executor.contract, executor.policy") == []


def test_the_coordinator_service_is_imported_only_by_its_commands() -> None:
    assert imported_after("import mesh.coordinator.cli") == []


def test_the_cli_s_copies_of_the_contract_s_constants_agree() -> None:
    from executor.backends import TIERS
    from executor.contract import LANGUAGES, SANDBOXES
    from mesh import cli

    assert cli.LANGUAGES == LANGUAGES and cli.SANDBOXES == SANDBOXES and cli.TIERS == TIERS


def test_the_exec_path_logs_lazily_and_imports_no_asyncio() -> None:
    """`exec` imports what it runs on (Trio, the Docker SDK) but not structlog, nor the asyncio structlog brings:
    they are imported at the first log line (executor/lazylog.py), and a run that goes well logs nothing."""
    probe = "import mesh.commands, executor.runner, sys\n"
    probe += "print(sorted(m for m in ('structlog', 'asyncio') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_a_lazy_logger_logs_through_structlog_once_used() -> None:
    import structlog.testing

    from executor import lazylog

    log = lazylog.get_logger("edgecoder.test")
    with structlog.testing.capture_logs() as seen:
        log.warning("lazy.event", detail=1)
    assert seen == [{"event": "lazy.event", "detail": 1, "log_level": "warning"}]
