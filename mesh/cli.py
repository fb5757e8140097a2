"""`edgecoder`: the command line, the contract that users and tests rely on.

stdout carries only machine-readable lines (the `ready` event, a result as one JSON object) or, for the inspection
commands, what the person asked to see; logs go to stderr.

Start-up is part of the interface: `edgecoder --help` and `keygen` must answer in a few tens of milliseconds, so
this module imports only click and light modules of our own. Trio, structlog, libp2p, Docker, Starlette, Hypercorn
and httpx are imported inside the commands that use them (benchmarks/bench_startup.py measures it, and
tests/test_cli_startup.py pins which modules a bare import pulls in).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

import click

from mesh.cli_common import (
    EXIT_INTERRUPTED,
    LANGUAGES,
    SANDBOXES,
    TIERS,
    InputError,
    cause_of,
    config_option,
    emit,
    load_identity,
    run_command,
)
from mesh.cli_inspect import jobs, peers, status
from mesh.cli_settings import resolve_settings, setting_options
from mesh.cli_work import exec_, offer
from mesh.config_kinds import ConfigError

# Names the tests and other modules import from here.
__all__ = ["LANGUAGES", "SANDBOXES", "TIERS", "cause_of", "load_identity", "main", "node", "resolve_settings", "run"]

_debug = os.environ.get("EDGECODER_DEBUG") == "1"


def _set_debug(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    global _debug
    _debug = _debug or value


# Commands built on first use: name -> (module, attribute).
LAZY_COMMANDS = {"coordinator": ("mesh.coordinator.cli", "coordinator"), "cancel": ("mesh.cli_jobs", "cancel")}


class Commands(click.Group):
    """The `edgecoder` group. `coordinator` (a group of its own, with a dozen options) is built only when it is asked
    for or listed (by --help, and by the docs' CLI reference): `keygen` and `node` need not pay for it."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *LAZY_COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in LAZY_COMMANDS and cmd_name not in self.commands:
            import importlib

            module, name = LAZY_COMMANDS[cmd_name]
            self.add_command(getattr(importlib.import_module(module), name), cmd_name)
        return super().get_command(ctx, cmd_name)


@click.group(cls=Commands, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 120})
@click.option(
    "--debug",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_set_debug,
    help="Show the traceback of an unexpected error (also EDGECODER_DEBUG=1).",
)
def main() -> None:
    """A mesh node that runs strangers' signed task offers, only ever inside a hardened Docker sandbox."""


def run(argv: list[str] | None = None) -> None:
    """The `edgecoder` entry point: every failure is one line and an exit code, never a traceback (unless --debug).

    Exit codes: 0 ok, 1 the run failed (or an unexpected error), 2 usage or bad input, 3 a typed refusal,
    130 interrupted (Ctrl-C).
    """
    try:
        code = main.main(args=argv, prog_name="edgecoder", standalone_mode=False)
    except click.UsageError as exc:
        # One line, like every other refusal: click's usage block would push the reason off a small terminal.
        where = exc.ctx.command_path if exc.ctx is not None else "edgecoder"
        message = " ".join(exc.format_message().split())  # click lays some messages out over several lines
        click.echo(f"Error: {message} (see: {where} --help)", err=True)
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except (click.Abort, KeyboardInterrupt):
        click.echo("interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except Exception as exc:
        if _debug:
            raise
        # What went wrong, not the nursery it went wrong in: Trio wraps a task's failure in exception groups.
        leaf: BaseException = exc
        while isinstance(leaf, BaseExceptionGroup) and leaf.exceptions:
            leaf = leaf.exceptions[0]
        what = " ".join(f"{type(leaf).__name__}: {leaf}".split())
        click.echo(f"edgecoder: unexpected error: {what} (run with --debug for details)", err=True)
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)


@main.command()
@click.option(
    "--out",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Where to write the 32-byte Ed25519 seed (mode 0600).",
)
@click.option("--force", is_flag=True, help="Overwrite an existing key file.")
def keygen(out: Path, force: bool) -> None:
    """Write a new node identity and print its PeerID."""
    from transports.wire.identity import KeyFileError, NodeIdentity
    from transports.wire.peerid import ed25519_peer_id

    identity = NodeIdentity.generate()
    try:
        identity.save(out, force=force)
    except KeyFileError as exc:
        raise InputError(str(exc)) from None
    click.echo(ed25519_peer_id(identity.public_key))


@main.command(context_settings={"show_default": False})
@setting_options
@click.option("--ble-sim", is_flag=True, help="BLE on a simulated radio in this process (implies --ble).")
@click.pass_context
def node(ctx: click.Context, ble_sim: bool, **params: Any) -> None:
    """Run a node. Its first stdout line is the `ready` event as JSON.

    Every setting can also come from EDGECODER_* variables or edgecoder.toml (`edgecoder config show` prints what
    is in effect and where each value came from)."""
    from mesh import logs
    from mesh.config import node_settings
    from mesh.state import default_state_root

    resolved = resolve_settings(ctx, params)
    try:
        settings = node_settings(resolved)
    except (ConfigError, ValueError) as exc:
        raise InputError(str(exc)) from None
    logs.configure(json_lines=settings.log_format == "json", level_name=settings.log_level)
    if settings.key is None:
        raise InputError(
            "no key file: give --key PATH (or EDGECODER_KEY, or key in [node] of edgecoder.toml); "
            "make one with: edgecoder keygen --out node.key"
        )
    if settings.ble_hci is not None:
        from transports.ble.hci import BleSetupError, HciSpec

        try:
            HciSpec.parse(settings.ble_hci)
        except BleSetupError as exc:
            raise InputError(f"node.ble_hci from {resolved.sources['node.ble_hci']}: {exc}") from None
        if ble_sim:
            raise click.UsageError("--ble-hci and --ble-sim name two different radios: give one of them")
    if settings.key.is_dir():
        raise InputError(
            f"node.key from {resolved.sources['node.key']}: {settings.key} is a directory; give the key file "
            "(make one with: edgecoder keygen --out node.key)"
        )
    identity = load_identity(settings.key)
    from mesh.commands import NodeOptions, run_node

    options = NodeOptions(
        identity=identity,
        settings=settings,
        ble_sim=ble_sim,
        state_root=settings.state_dir or default_state_root(),
    )
    run_command(run_node, options)


@main.group()
def config() -> None:
    """The node's settings: edgecoder.toml, EDGECODER_* variables and flags."""


@config.command("show")
@setting_options
@click.option("--json", "as_json", is_flag=True, help="One JSON object instead of a table.")
@click.pass_context
def config_show(ctx: click.Context, as_json: bool, **params: Any) -> None:
    """Print the effective settings and where each came from (flag, env, file or default).

    Takes the same options as `edgecoder node`, so `edgecoder config show --concurrency 4` shows what that node
    would run with. Values are checked as the node checks them: a bad one is refused the same way."""
    from mesh.config import node_settings, shown

    resolved = resolve_settings(ctx, params)
    try:
        node_settings(resolved)
    except (ConfigError, ValueError) as exc:
        raise InputError(str(exc)) from None
    rows = resolved.rows()
    if as_json:
        emit(
            {
                "file": None if resolved.file is None else str(resolved.file),
                "settings": [
                    {"key": key, "value": shown(value), "source": source.kind, "from": source.where}
                    for key, value, source in rows
                ],
            }
        )
        return
    click.echo(f"config file: {resolved.file or 'none (give --config PATH or EDGECODER_CONFIG)'}")
    from mesh.config import BY_KEY

    texts = [json.dumps(shown(value)) if value is not None else f"({BY_KEY[key].unset})" for key, value, _ in rows]
    width = max(len(key) for key, _, _ in rows) + 2
    value_width = min(60, max(len(t) for t in texts))
    for (key, _, source), text in zip(rows, texts, strict=True):  # a value wider than its column still gets a gap
        click.echo(f"{key:<{width}}{text:<{value_width}}  {source}")


@main.command()
@click.option("--json", "as_json", is_flag=True, help="One JSON object instead of text.")
@config_option
def doctor(as_json: bool, config_file: Path | None) -> None:
    """Say whether this machine can sandbox, and why not. Exits non-zero when it cannot.

    It checks the settings a node would run with (EDGECODER_* variables, --config or EDGECODER_CONFIG): its sandbox
    mode, image, seccomp profile and isolation tiers. It prints the Docker, runc and runsc versions, the cgroup
    version, userns-remap, the seccomp profile, a canary per tier, and each failure or warning with its fix."""
    import trio

    from mesh.commands import run_doctor
    from mesh.config import node_settings, resolve

    try:  # the settings a node would run with: variables, then the file, then the defaults
        settings = node_settings(resolve({}, config=config_file))
    except (ConfigError, ValueError) as exc:
        raise InputError(str(exc)) from None
    from mesh import logs

    logs.configure(level=40)  # the report says what the executor's warnings would: once, with the fix
    report = trio.run(run_doctor, settings)
    if as_json:
        emit(report)
    else:
        marks = {"ok": "ok  ", "warn": "WARN", "fail": "FAIL", "info": "info"}
        for check in report["checks"]:
            click.echo(f"[{marks.get(check.get('level', ''), 'FAIL')}] {check['name']}: {check['detail']}")
            if check.get("fix") and check.get("level") in ("warn", "fail"):
                click.echo(f"       fix: {check['fix']}")
        click.echo("this node can sandbox" if report["ok"] else "this node CANNOT sandbox: it will refuse remote work")
    sys.exit(0 if report["ok"] else 1)


@main.group()
def image() -> None:
    """The sandbox image."""


@image.command("build")
@click.option(
    "--tag",
    default=None,
    help="Image tag of the python runtime (default: $EDGECODER_IMAGE or edgecoder-sandbox:bookworm).",
)
@click.option(
    "--runtime",
    "runtime_names",
    multiple=True,
    metavar="NAME",
    help="Build this declared runtime (repeatable; executor.runtimes in the settings). Default: python.",
)
@click.option("--all", "build_all", is_flag=True, help="Build every declared runtime.")
@click.option(
    "--if-missing", is_flag=True, help="Do nothing for an image present with user 65534 and its package list."
)
@click.option("--rebuild", is_flag=True, help="Ignore the cached root file system and run debootstrap again.")
@config_option
def image_build(
    tag: str | None,
    runtime_names: tuple[str, ...],
    build_all: bool,
    if_missing: bool,
    rebuild: bool,
    config_file: Path | None,
) -> None:
    """Build sandbox images from Debian packages (no registry needed): one per runtime, cached by package list."""
    from executor.images import ImageError, build_image, runtime_built
    from mesh.config import node_settings, resolve

    try:
        policy = node_settings(resolve({}, config=config_file)).executor_policy
    except (ConfigError, ValueError) as exc:
        raise InputError(str(exc)) from None
    if tag:
        policy = dataclasses.replace(policy, image=tag)
    names = policy.runtime_names if build_all else runtime_names or ("python",)
    for name in names:
        runtime = policy.runtime(name)
        if runtime is None:
            raise InputError(f"runtime {name!r} is not declared (declared: {', '.join(policy.runtime_names)})")
        try:
            if if_missing and runtime_built(runtime):
                click.echo(f"runtime {name}: image {runtime.image} is present (user 65534, packages listed)")
                continue
            click.echo(f"runtime {name}: building {runtime.image}")
            build_image(runtime.image, runtime=runtime, progress=lambda line: click.echo(f"  {line}"), rebuild=rebuild)
        except ImageError as exc:
            raise click.ClickException(str(exc)) from None


@main.command()
@click.option("--nodes", type=click.IntRange(2, 16), default=3, show_default=True)
@click.option("--ble/--no-ble", default=True, show_default=True, help="Include an offer from a simulated BLE peer.")
def demo(nodes: int, ble: bool) -> None:
    """A local demo mesh that runs real signed offers in Docker, and shows what a sandbox-less node refuses."""
    import trio

    from mesh import logs
    from mesh.demo import run_demo

    logs.configure(level=40)
    sys.exit(trio.run(run_demo, nodes, ble))


for command in (status, peers, jobs, offer, exec_):
    main.add_command(command)


if __name__ == "__main__":
    run()
