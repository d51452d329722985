"""Stage configs: dataclass defaults, then a YAML file (`--config`), then command-line overrides.

The precedence and the field names follow TRL's `TrlParser`; unlike it, an unknown key in the YAML
file is an error that names the file and the key, and each run writes its resolved config.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args, get_origin

import yaml

from emoji_rl.errors import UserError

C = TypeVar("C")


def _bool(text: str) -> bool:
    lowered = text.lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off"}:
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _unwrap_optional(tp: Any) -> tuple[Any, bool]:
    if get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return tp, False


def _add_field(parser: argparse.ArgumentParser, field: dataclasses.Field, tp: Any) -> None:
    tp, optional = _unwrap_optional(tp)
    help_text = field.metadata.get("help", "").replace("%", "%%")  # argparse formats help with %
    kwargs: dict[str, Any] = {"dest": field.name, "help": f"{help_text} (default: %(default)s)"}
    origin = get_origin(tp)
    if origin is Literal:
        choices = list(get_args(tp))
        kwargs.update(type=type(choices[0]), choices=choices)
    elif tp is bool:
        # A bare `--flag` means true, as in HfArgumentParser; `--flag false` still turns it off.
        kwargs.update(type=_bool, metavar="{true,false}", nargs="?", const=True)
    elif origin in (list, tuple):
        (item,) = get_args(tp)[:1]
        kwargs.update(type=item, nargs="*" if optional else "+")
    elif tp in (int, float, str):
        kwargs["type"] = tp
    else:
        raise TypeError(f"config field {field.name}: unsupported type {tp!r}")
    if optional and origin not in (list, tuple):
        base = kwargs["type"]
        kwargs["type"] = lambda s, _b=base: None if s.lower() in {"none", "null"} else _b(s)
        if "choices" in kwargs:  # argparse checks choices after the type turned "none" into None
            kwargs["choices"] = [*kwargs["choices"], None]
            kwargs["metavar"] = "{" + ",".join(map(str, get_args(tp))) + ",none}"
    if field.default is not dataclasses.MISSING:
        kwargs["default"] = field.default
    elif field.default_factory is not dataclasses.MISSING:
        kwargs["default"] = field.default_factory()
    else:
        kwargs["required"] = True
    parser.add_argument(f"--{field.name}", **kwargs)


def build_parser(cls: type, prog: str, description: str | None) -> argparse.ArgumentParser:
    """An argparse parser with one `--field` per dataclass field, plus `--config FILE.yaml`."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument("--config", metavar="FILE.yaml", help="YAML file of field values (CLI flags win)")
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        if field.init:
            _add_field(parser, field, hints[field.name])
    return parser


def load_yaml_overrides(path: str | Path, cls: type) -> dict[str, Any]:
    """Read a YAML mapping of field values; any key that is not a field of `cls` is an error."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"config file {path} does not exist")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise UserError(f"config file {path} is not valid YAML: {err}") from err
    if not isinstance(data, dict):
        raise UserError(f"config file {path} must hold a mapping of field: value, got {type(data).__name__}")
    known = {f.name for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - known)
    if unknown:
        raise UserError(
            f"config file {path}: unknown key(s) {', '.join(unknown)} for {cls.__name__}; "
            f"valid keys: {', '.join(sorted(known))}"
        )
    return data


def parse_config(cls: type[C], argv: list[str], prog: str) -> C:
    """Defaults, then `--config` YAML, then the command line; returns an instance of `cls`."""
    parser = build_parser(cls, prog, (cls.__doc__ or "").strip() or None)
    config_path = _find_config(argv)
    if config_path is not None:
        parser.set_defaults(**load_yaml_overrides(config_path, cls))
    namespace = vars(parser.parse_args(argv))
    namespace.pop("config", None)
    try:
        return cls(**namespace)
    except (ValueError, TypeError) as err:
        raise UserError(str(err)) from err


def _find_config(argv: list[str]) -> str | None:
    for i, arg in enumerate(argv):
        if arg == "--config":
            if i + 1 >= len(argv):
                raise UserError("--config needs a file path")
            return argv[i + 1]
        if arg.startswith("--config="):
            return arg.split("=", 1)[1]
    return None


def to_dict(cfg: object) -> dict[str, Any]:
    return dataclasses.asdict(cfg)  # type: ignore[call-overload]


def save_config(cfg: object, run_dir: str | Path) -> Path:
    """Write the resolved config of a run to `run_dir/config.yaml`, for reproduction."""
    path = Path(run_dir) / "config.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False, allow_unicode=True))
    return path
