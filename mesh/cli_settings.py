"""Settings as options: every row of a settings table that has a flag becomes a click option, and the flags the user
typed are resolved with the table's variables, file and defaults (mesh/config_resolve.py). The node (`node`,
`config show`) and the coordinator (`coordinator`) build their options this way, each from its own table."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import click

from mesh.cli_common import InputError, config_option
from mesh.config_kinds import Auto, Bool, ConfigError, ListOf, Setting

if TYPE_CHECKING:
    from mesh.config_resolve import Resolved


def _param_name(setting: Setting) -> str:
    return "setting__" + setting.key.replace(".", "__")


def _option_help(setting: Setting) -> str:
    text = setting.help
    if setting.pending:
        text += f" {setting.pending}."
    return f"{text} [{setting.key}, {setting.env_names[0]}]"


def _metavar(setting: Setting) -> str:
    from mesh.config import Choice, FloatRange, IntRange, PathKind

    kind = setting.kind.item if isinstance(setting.kind, ListOf) else setting.kind
    named = {
        "node.state_dir": "DIR",
        "metrics.bind": "HOST:PORT",
        "coordinator.url": "URL",
        "coordinator.key": "KEY",
        "executor.image": "TAG",
        "coordinator.db": "FILE",
        "coordinator.listen": "HOST:PORT",
    }
    if setting.key in named:
        return named[setting.key]
    if isinstance(kind, Choice):
        return "[" + "|".join(kind.choices) + "]"
    if isinstance(kind, IntRange):
        return "N"
    if isinstance(kind, FloatRange):
        return "X"
    if isinstance(kind, PathKind):
        return "PATH"
    if setting.key.endswith("_offerers"):
        return "PEERID"
    if setting.key == "intake.languages":
        return "LANGUAGE"
    if setting.key == "node.ble_hci":
        return "SPEC"
    return "MULTIADDR"


def _setting_option(setting: Setting) -> Any:
    assert setting.flag is not None
    name = _param_name(setting)
    flags = setting.flag.split("/")
    help_text = _option_help(setting)
    if isinstance(setting.kind, Auto | Bool) and len(flags) == 2:
        return click.option(setting.flag, name, default=None, help=help_text)
    if isinstance(setting.kind, Bool):
        return click.option(flags[0], name, is_flag=True, default=False, help=help_text)
    decls = [flags[0], "--peer"] if setting.key == "node.bootstrap" else [flags[0]]
    if isinstance(setting.kind, ListOf):
        return click.option(*decls, name, multiple=True, metavar=_metavar(setting), help=help_text + " Repeatable.")
    return click.option(*decls, name, default=None, metavar=_metavar(setting), help=help_text)


def table_options(table: Sequence[Setting]) -> Any:
    """A decorator: every setting of `table` that has a flag, as an option."""

    def decorate(fn: Any) -> Any:
        for setting in reversed(table):
            if setting.flag is not None:
                fn = _setting_option(setting)(fn)
        return fn

    return decorate


def setting_options(fn: Any) -> Any:
    """The node's settings as options (mesh.config.SETTINGS), with --config; `--metrics-port N` and `--log-json`
    are shorthands."""
    from mesh.config import SETTINGS

    fn = click.option(
        "--log-json", "log_json", is_flag=True, help="Shorthand for --log-format json (structured logs on stderr)."
    )(fn)
    fn = click.option(
        "--metrics-port",
        "metrics_port",
        type=click.IntRange(0, 65535),
        default=None,
        help="Shorthand for --metrics 127.0.0.1:PORT; 0 picks a free port (the ready line gives it).",
    )(fn)
    return config_option(table_options(SETTINGS)(fn))


def typed_flags(ctx: click.Context, params: dict[str, Any], table: Sequence[Setting]) -> dict[str, tuple[Any, str]]:
    """The flags of `table` the user typed (not click's defaults), by key: (value, the flag as typed)."""
    from click.core import ParameterSource

    flags: dict[str, tuple[Any, str]] = {}
    for setting in table:
        if setting.flag is None:
            continue
        name = _param_name(setting)
        if ctx.get_parameter_source(name) != ParameterSource.COMMANDLINE:
            continue
        value = params[name]
        if isinstance(value, tuple) and not value:
            continue
        flags[setting.key] = (value, _flag_shown(setting, value))
    return flags


def resolve_settings(ctx: click.Context, params: dict[str, Any]) -> Resolved:
    """The node's settings: flags the user typed, then the environment, the file and the defaults."""
    from mesh.config import SETTINGS, resolve

    flags = typed_flags(ctx, params, SETTINGS)
    if params.get("metrics_port") is not None:
        if "metrics.bind" in flags:
            raise click.UsageError("--metrics and --metrics-port name the same setting: give one of them")
        flags["metrics.bind"] = (f"127.0.0.1:{params['metrics_port']}", "--metrics-port")
    if params.get("log_json"):
        flags["log.format"] = ("json", "--log-json")
    try:
        return resolve(flags, config=params.get("config_file"))
    except ConfigError as exc:
        raise InputError(str(exc)) from None


def _flag_shown(setting: Setting, value: Any) -> str:
    assert setting.flag is not None
    flags = setting.flag.split("/")
    if isinstance(setting.kind, Auto | Bool) and len(flags) == 2:
        return flags[0] if value else flags[1]
    return flags[0]
