"""Resolution: each setting of a table from the first of a flag, its `EDGECODER_*` variable, the TOML file, its
default; every value checked where it is read and refused with the key, where it came from and what it must be."""

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from mesh.config_kinds import ConfigError, ListOf, Setting, Source

CONFIG_ENV = "EDGECODER_CONFIG"


class Resolved:
    """Every setting's effective value and where it came from."""

    def __init__(
        self,
        values: Mapping[str, Any],
        sources: Mapping[str, Source],
        file: Path | None = None,
        table: Sequence[Setting] = (),
    ) -> None:
        self.values, self.sources, self.file, self.table = values, sources, file, table

    def __getitem__(self, key: str) -> Any:
        return self.values[key]

    def rows(self) -> list[tuple[str, Any, Source]]:
        return [(s.key, self.values[s.key], self.sources[s.key]) for s in self.table]


def _refusal(setting: Setting, source: Source, reason: str) -> ConfigError:
    return ConfigError(f"{setting.key} from {source}: {reason}; it must be {setting.kind.describe()}")


def read_file(
    path: Path, named_by: Source | None = None, *, known: Mapping[str, Setting]
) -> dict[str, tuple[Any, Source]]:
    """The file's settings as raw TOML values, by key. Unknown keys are refused, with the nearest known one."""
    import tomllib

    source = Source("file", str(path))
    where = f"config file {path}" + (f" (from {named_by})" if named_by is not None else "")
    try:
        with path.open("rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"{where} does not exist: fix --config or {CONFIG_ENV}") from None
    except IsADirectoryError:
        raise ConfigError(f"{where} is a directory: give the path of edgecoder.toml") from None
    except OSError as exc:
        raise ConfigError(f"cannot read {where}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    found: dict[str, tuple[Any, Source]] = {}
    for section, table in data.items():
        if not isinstance(table, dict):
            raise ConfigError(
                f"{path}: {section!r} must be a [section]; keys go inside one, e.g. [node] listen = [...]"
            )
        for name, value in table.items():
            key = f"{section}.{name}"
            if key not in known:
                import difflib

                near = difflib.get_close_matches(key, known, n=1)
                hint = f"; did you mean {near[0]}?" if near else "; see `edgecoder config show` for every key"
                raise ConfigError(f"{path}: unknown setting {key}{hint}")
            found[key] = (value, source)
    return found


def config_path(flag: Path | None, environ: Mapping[str, str]) -> tuple[Path | None, Source | None]:
    if flag is not None:
        return flag, Source("flag", "--config")
    text = environ.get(CONFIG_ENV, "").strip()
    if text:
        return Path(text).expanduser(), Source("env", CONFIG_ENV)
    return None, None


def resolve_table(
    table: Sequence[Setting],
    flags: Mapping[str, Any] | None = None,
    *,
    config: Path | None = None,
    environ: Mapping[str, str] | None = None,
    read_config: bool = True,
    check: Callable[[Mapping[str, Any], Mapping[str, Source]], None] | None = None,
) -> Resolved:
    """The effective settings of `table`. `flags` maps keys to values the command line gave (already the kind's
    value, or text to parse); keys it lacks fall through to the environment, the file (when `read_config`) and the
    defaults. `check` judges the values together. Raises `ConfigError`."""
    env = os.environ if environ is None else environ
    flags = flags or {}
    path, named_by = config_path(config, env) if read_config else (None, None)
    in_file = read_file(path, named_by, known={s.key: s for s in table}) if path is not None else {}
    values: dict[str, Any] = {}
    sources: dict[str, Source] = {}
    for setting in table:
        value, source = _one(setting, flags, env, in_file)
        if isinstance(value, Path) and source.kind == "file" and path is not None and not value.is_absolute():
            value = path.parent / value
        values[setting.key] = value
        sources[setting.key] = source
    if check is not None:
        check(values, sources)
    return Resolved(values, sources, path, table)


def _one(
    setting: Setting, flags: Mapping[str, Any], env: Mapping[str, str], in_file: Mapping[str, tuple[Any, Source]]
) -> tuple[Any, Source]:
    if setting.key in flags:
        value, where = flags[setting.key]
        source = Source("flag", where)
        try:
            if isinstance(value, str):
                value = setting.kind.from_text(value)
            elif isinstance(value, tuple | list) and isinstance(setting.kind, ListOf):
                value = setting.kind.items(list(value))
        except ValueError as exc:
            raise _refusal(setting, source, str(exc)) from None
        return value, source
    for name in setting.env_names:
        text = env.get(name)
        if text is not None and text.strip():
            source = Source("env", name)
            try:
                return setting.kind.from_text(text), source
            except ValueError as exc:
                raise _refusal(setting, source, str(exc)) from None
    if setting.key in in_file:
        raw, source = in_file[setting.key]
        try:
            return setting.kind.from_toml(raw), source
        except ValueError as exc:
            raise _refusal(setting, source, str(exc)) from None
    return setting.default, Source("default")
