"""Stage configs: dataclass defaults, then a YAML file (`--config`), then command-line overrides.

The precedence and the field names follow TRL's `TrlParser`; unlike it, an unknown key in the YAML
file is an error that names the file and the key, and each run writes its resolved config.

Fields several stages share are declared once, in a small dataclass beside the code they configure
(`JudgeConfig`, `ModelConfig`, `SamplingConfig`, `SimilarityConfig`, `RetrievalConfig`), and a stage's
Config inherits them; a stage whose default differs redeclares the field with `override`, keeping its
help. A field renamed keeps its old name as an alias (`metadata={"aliases": (...)}`) on the command
line and in YAML. The command line also takes TRL's spellings, as `HfArgumentParser` does: dashes for
underscores (`--learning-rate`), `--no_FIELD` to turn a flag off, and TRL's field names
where ours differ (`--model_name_or_path` for `model`).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import types
import typing
from pathlib import Path
from typing import Any, Literal, NoReturn, TypeVar, get_args, get_origin

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


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


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
        if get_origin(item) is Literal:  # a list of names: each one checked, as a Literal field is
            names = list(get_args(item))
            kwargs.update(type=type(names[0]), choices=names)
        else:
            kwargs["type"] = _finite_float if item is float else item
        kwargs["nargs"] = "*" if optional else "+"
    elif tp is float:
        kwargs["type"] = _finite_float
    elif tp in (int, str):
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
    names = [field.name, *_aliases(field)]
    parser.add_argument(*(f"--{name}" for name in names), **kwargs)
    # TRL's spellings, kept out of --help and of argparse's messages, which name the field as we do.
    hidden = {**kwargs, "help": argparse.SUPPRESS}
    hidden.pop("required", None)
    dashed = [f"--{name.replace('_', '-')}" for name in names if "_" in name]
    if dashed:
        parser.add_argument(*dashed, **hidden)
    if tp is bool:
        # HfArgumentParser's spelling for turning a flag off (`--no_gradient_checkpointing`), for any
        # flag: TRL's defaults differ from ours (its gradient_checkpointing is on), so users type it.
        off = dict.fromkeys(f"--no{sep}{n.replace('_', sep)}" for n in names for sep in "_-")
        parser.add_argument(*off, dest=field.name, action="store_false", help=argparse.SUPPRESS)


def _aliases(field: dataclasses.Field) -> tuple[str, ...]:
    return tuple(field.metadata.get("aliases", ()))


class Checked:
    """The root of a config's parts: each part's `__post_init__` checks its own fields and calls
    `super().__post_init__()`, so that a config made of several parts (grpo's: the trainer's and the
    game's) runs every check; this one ends the chain."""

    def __post_init__(self) -> None:
        """Nothing is left to check."""


def peek(argv: list[str], name: str) -> str | None:
    """The value `--name` has on a command line, or else in its `--config` YAML, before the whole
    config is parsed: the field that decides which fields there are (grpo's `game`)."""
    for i, arg in enumerate(argv):
        if arg == f"--{name}" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(f"--{name}="):
            return arg.split("=", 1)[1]
    path = _find_config(argv)
    try:
        data = read_yaml(path) if path is not None else None
    except UserError:
        return None  # the whole parse says what is wrong with it
    value = data.get(name) if isinstance(data, dict) else None
    return value if isinstance(value, str) else None


class _UniqueKeys(yaml.SafeLoader):
    """PyYAML's safe loader that refuses a key given twice in one mapping: PyYAML itself keeps the last
    one, so the first would be a setting silently not taken."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        first: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            line = key_node.start_mark.line + 1
            if isinstance(key, str) and key in first:
                raise yaml.constructor.ConstructorError(
                    problem=f"{key} is given twice (first on line {first[key]})",
                    problem_mark=key_node.start_mark,
                )
            if isinstance(key, str):
                first[key] = line
        return super().construct_mapping(node, deep=deep)


def read_yaml(path: str | Path) -> Any:
    """A YAML file's document (None: empty), strictly: an error names the file and the line, for a
    file that is missing, a folder, not UTF-8, not YAML, or gives a key twice."""
    path = Path(path)
    if path.is_dir():
        raise UserError(f"config file {path} is a folder, not a YAML file")
    if not path.is_file():
        raise UserError(f"config file {path} does not exist")
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise UserError(f"config file {path}:{line}: not valid UTF-8; save it as UTF-8") from None
    try:
        return yaml.load(text, Loader=_UniqueKeys)  # a SafeLoader: builds no Python objects
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        started = f" ({err.context} on line {err.context_mark.line + 1})" if err.context_mark else ""
        raise UserError(f"config file {where}: not valid YAML: {err.problem}{started}") from None
    except yaml.YAMLError as err:
        raise UserError(f"config file {path}: not valid YAML: {err}") from None


def override(base: type, name: str, default: Any = dataclasses.MISSING, **metadata: Any) -> Any:
    """Field `name` of the dataclass `base`, for a subclass that changes its default (or its help or
    bounds, given as metadata): the help and the rest of the metadata stay the base's."""
    (inherited,) = (f for f in dataclasses.fields(base) if f.name == name)
    if default is dataclasses.MISSING:
        default = inherited.default
    return dataclasses.field(default=default, metadata={**inherited.metadata, **metadata})


class _Parser(argparse.ArgumentParser):
    """argparse's parser whose errors (an unknown flag, a bad choice or value) are a UserError, one
    line as every other config error, rather than the usage first: a stage's usage lists every field
    (53 lines for grpo), above the line that says what was wrong."""

    def error(self, message: str) -> NoReturn:
        raise UserError(f"{message} (`{self.prog} --help` lists the fields)")


def build_parser(cls: type, prog: str, description: str | None) -> argparse.ArgumentParser:
    """An argparse parser with one `--field` per dataclass field, plus `--config FILE.yaml`."""
    parser = _Parser(
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
    data = read_yaml(path)
    if data is None:
        raise UserError(
            f"config file {path}:1: holds no settings (empty, or only comments); write field: value "
            "lines in it, or leave --config out"
        )
    if not isinstance(data, dict):
        raise UserError(f"config file {path} must hold a mapping of field: value, got {type(data).__name__}")
    known = {f.name for f in dataclasses.fields(cls) if f.init}
    for f in dataclasses.fields(cls):
        for alias in (a for a in _aliases(f) if a in data):
            if f.name in data:
                raise UserError(f"config file {path}: {alias} and {f.name} name one field; keep {f.name}")
            data[f.name] = data.pop(alias)
    unknown = sorted(set(data) - known)
    if unknown:
        raise UserError(
            f"config file {path}: unknown key(s) {', '.join(unknown)} for {cls.__name__}; "
            f"valid keys: {', '.join(sorted(known))}"
        )
    hints = typing.get_type_hints(cls)
    return {key: _yaml_value(path, key, hints[key], value) for key, value in data.items()}


def _yaml_value(path: Path, key: str, tp: Any, value: Any) -> Any:
    """A YAML value as its field's type. The command line's values pass through argparse's `type`;
    YAML's reach the dataclass as parsed, so a wrong type would fail deep in a library, or not at all."""
    tp, optional = _unwrap_optional(tp)
    if value is None:
        if optional:
            return None
        raise UserError(f"config file {path}: {key} is empty; give it a value or leave the key out")
    origin = get_origin(tp)
    if origin in (list, tuple):
        (item,) = get_args(tp)[:1]
        if get_origin(item) is Literal and isinstance(value, str):
            value = [value]  # one name stands for a list of one, as TRL's `report_to: wandb`
        if get_origin(item) is Literal and not isinstance(value, list):
            names = ", ".join(map(str, get_args(item)))
            raise UserError(
                f"config file {path}: {key} must be one of {names}, or a list of them; got {value!r}"
            )
        if not isinstance(value, list):
            raise UserError(
                f"config file {path}: {key} must be a list, e.g. {key}: [{value!r}], got {value!r}"
            )
        return [_scalar(path, key, item, v) for v in value]
    return _scalar(path, key, tp, value)


def _scalar(path: Path, key: str, tp: Any, value: Any) -> Any:
    def wrong(what: str) -> UserError:
        return UserError(f"config file {path}: {key} must be {what}, got {value!r}")

    if get_origin(tp) is Literal:
        if value not in get_args(tp):
            raise wrong(f"one of {', '.join(map(str, get_args(tp)))}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise wrong("true or false")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise wrong("a whole number")
        return value
    if tp is float:
        # PyYAML reads 1e-4 (no dot) as a string: take any text float() reads.
        try:
            number = float(value) if not isinstance(value, bool) else math.nan
        except (TypeError, ValueError):
            number = math.nan
        if not math.isfinite(number):
            raise wrong("a finite number")
        return number
    if tp is str:
        if not isinstance(value, str):
            raise wrong("text (quote it)")
        return value
    return value


def parse_config(cls: type[C], argv: list[str], prog: str) -> C:
    """Defaults, then `--config` YAML, then the command line; returns an instance of `cls`."""
    parser = build_parser(cls, prog, (cls.__doc__ or "").strip() or None)
    config_path = _find_config(argv)
    if config_path is not None:
        parser.set_defaults(**load_yaml_overrides(config_path, cls))
    namespace = vars(parser.parse_args(argv))
    namespace.pop("config", None)
    _check_bounds(cls, namespace, config_path)
    try:
        return cls(**namespace)
    except (ValueError, TypeError) as err:
        raise UserError(str(err)) from err


def _check_bounds(cls: type, values: dict[str, Any], config_path: str | None) -> None:
    """Each field's `min` and `max` (metadata), wherever its value came from: a game of 0 turns never
    ends."""
    for field in dataclasses.fields(cls):
        low, high = field.metadata.get("min"), field.metadata.get("max")
        value = values.get(field.name)
        if value is None:
            continue
        where = f" (--{field.name}, or {field.name}: in {config_path})" if config_path else ""
        for item in value if isinstance(value, list) else [value]:
            if low is not None and item < low:
                raise UserError(f"{field.name}={item!r} must be >= {low}{where}")
            if high is not None and item > high:
                raise UserError(f"{field.name}={item!r} must be <= {high}{where}")


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
