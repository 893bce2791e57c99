"""What every group of commands shares: flags made from a settings dataclass (help, checks and choices
in its fields' metadata; every flag of every command is one), old flag spellings kept for one
release, --config FILE, and what a stage split by rank is keyed on."""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from odqa.common.settings import (
    finite_error,
    flag_of,
    from_flat,
    is_section,
    leaves,
    range_error,
    read_settings_file,
    writes_error,
)

REMOVED_IN = "0.3"   # the release that drops the deprecated spellings


class Deprecated(argparse.Action):
    """An old spelling of a flag (of a switch, or its --no- form: `value`): it still sets the value, and
    says which spelling to use."""

    def __init__(self, option_strings, dest, use: str, value: bool | None = None, **kwargs):
        self.use, self.value = use, value
        super().__init__(option_strings, dest, **({**kwargs, "nargs": 0} if value is not None else kwargs))

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"odqa: warning: {option_string} is deprecated and goes in {REMOVED_IN}; use {self.use}", file=sys.stderr)
        setattr(namespace, self.dest, values if self.value is None else self.value)


def add_flag(p: argparse.ArgumentParser, flag: str, aliases=(), required: bool = False, **kwargs) -> None:
    """p.add_argument(flag, ...), plus hidden old spellings (`aliases`) of the same setting (of a
    switch, its --no- form too)."""
    if not aliases:
        p.add_argument(flag, required=required, **kwargs)
        return
    group = p.add_mutually_exclusive_group(required=required)
    group.add_argument(flag, **kwargs)
    hidden = dict(dest=kwargs["dest"], default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    for old in aliases:
        if "action" not in kwargs:
            group.add_argument(old, action=Deprecated, use=flag, type=kwargs.get("type"), nargs=kwargs.get("nargs"),
                               **hidden)
            continue
        group.add_argument(old, action=Deprecated, use=flag, value=True, **hidden)
        if kwargs["action"] is argparse.BooleanOptionalAction:
            group.add_argument("--no-" + old[2:], action=Deprecated, use="--no-" + flag[2:], value=False, **hidden)


def leaf_defaults(cls) -> dict:
    """Each flat name of `cls`'s tree and its default there (a section's field: the section's default's
    value, which may differ from the field's class default), `dataclasses.MISSING` where it has none."""
    out = {}
    for f in dataclasses.fields(cls):
        if is_section(f):
            holder = f.default_factory()
            for name, at, _ in leaves(f.metadata["section"], f.metadata["rename"]):
                value = holder
                for part in at:
                    value = getattr(value, part)
                out[name] = value
        elif f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
        else:
            out[f.name] = dataclasses.MISSING
    return out


def add_dataclass_args(p: argparse.ArgumentParser, cls, defaults: dict | None = None, unset: bool = False,
                       only=None) -> None:
    """One flag per setting of a settings dataclass, its sections' too (--field-name, the field's
    metadata "flag", a section's renamed flat name, or a positional argument), with the field's
    metadata "help"; `defaults` overrides defaults that depend on $ODQA_HOME. With `unset`, a flag not
    given parses as None, so that `dataclass_from_args` can tell it from one given (the help still
    shows the default). `only(field)`: whether a field of `cls` itself is a flag here (the recipe's
    fields that `odqa demo` takes)."""
    defaults, base = defaults or {}, leaf_defaults(cls)
    for name, _, f in leaves(cls):
        if only is not None and not only(f):
            continue
        meta = f.metadata
        flag = flag_of(f, name)
        default = defaults.get(name, base[name])
        # an input the command gives no default of its own (a `defaults` entry, None too) must be named
        required = name not in defaults and (default is dataclasses.MISSING or (meta.get("required") and default is None))
        kind = f.type if isinstance(f.type, str) else f.type.__name__
        help_ = meta.get("help", "")
        if kind.startswith("bool"):
            # A setting named as a negation (--no-reranker) is a plain switch: its --no- form would read --no-no-reranker.
            action = "store_true" if flag.startswith("--no-") and not default else argparse.BooleanOptionalAction
            add_flag(p, flag, meta.get("aliases", ()), dest=name, action=action, help=help_,
                     default=None if unset or default is None else bool(default))
            continue
        shown = "" if required or default is None else \
            f" (default: {' '.join(map(str, default)) if isinstance(default, list) else default})"
        conv = int if "int" in kind else float if "float" in kind else Path if "Path" in kind else str
        rule = meta.get("range")
        if rule is not None or conv is float:   # float() takes "nan" and "inf", which _converted refuses
            conv = _checked(conv, rule)
        if meta.get("writes"):
            conv = _writable(conv, meta["writes"])
        choices = {"choices": meta["choices"]} if "choices" in meta else \
            {"metavar": meta.get("metavar", flag.lstrip("-").upper().replace("-", "_"))}
        nargs = "+" if kind.startswith("list") else None
        if meta.get("positional"):   # named in its errors and usage as itself, not as a metavar
            p.add_argument(flag, type=conv, nargs=nargs, help=help_, **{k: v for k, v in choices.items() if k != "metavar"})
            continue
        add_flag(p, flag, meta.get("aliases", ()), required=required, dest=name, type=conv, nargs=nargs,
                 default=None if required or unset else default, help=help_ + shown, **choices)


def _checked(conv, rule: str | None):
    """An argparse type: `conv`, then the field's range rule, if it has one (common.settings.range_error)."""
    def parse(text: str):
        value = conv(text) if conv is str else _converted(conv, text)
        said = rule is not None and range_error(rule, value)
        if said:
            raise argparse.ArgumentTypeError(said)
        return value
    parse.__name__ = conv.__name__   # argparse names the type in its "invalid int value" errors
    return parse


def _writable(conv, kind: str):
    """An argparse type: a path that is not an existing path of the other kind (file or directory) than
    the field writes (common.settings.check_ranges says the same to a settings object)."""
    def parse(text: str):
        said = writes_error(kind, text)
        if said:
            raise argparse.ArgumentTypeError(said)
        return conv(text)
    parse.__name__ = conv.__name__
    return parse


def _converted(conv, text: str):
    try:
        value = conv(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a {'whole number' if conv is int else 'number'}: {text!r}") from None
    said = finite_error(value)
    if said:
        raise argparse.ArgumentTypeError(said)
    return value


def dataclass_from_args(cls, args, defaults: dict | None = None):
    """`cls` of the parsed flags (its sections' too, by flat name); a setting whose flag parsed as None
    (not given, under `unset`) takes its value from `defaults` (a pipeline record's settings), else
    keeps its default."""
    values, defaults, base = {}, defaults or {}, leaf_defaults(cls)
    for name, _, f in leaves(cls):
        value = getattr(args, name, None)
        if value is None and name in defaults:
            values[name] = defaults[name]
        elif value is not None or base[name] is dataclasses.MISSING:
            values[name] = value   # a required field that a command's own default left None stays None
    return from_flat(cls, values)


def given(cls, args) -> dict:
    """The settings of `cls` (flat names) whose flags were given: those a command's `unset` flags did
    not parse as None."""
    return {name: getattr(args, name) for name, _, _ in leaves(cls) if getattr(args, name, None) is not None}


def command(parent, name: str, func, quick_exit: bool = False, **kwargs) -> argparse.ArgumentParser:
    """A subcommand's parser, with the handler it runs. `quick_exit`: the command leaves nothing to
    finish once it returns (no tracker, process or open file), so the `odqa` script ends it without the
    interpreter's teardown (`cli.console`)."""
    p = parent.add_parser(name, **kwargs)
    p.set_defaults(func=func, quick_exit=quick_exit)
    return p


def stage_key(args) -> dict:
    """What a stage's finished batches were made from: every flag, and each file or directory a flag
    names, by its files' names, sizes and times."""
    from odqa.common.artifact import path_fingerprint
    key = {}
    for name, value in vars(args).items():
        if callable(value) or name == "out":
            continue
        key[name] = [str(value), path_fingerprint(value)] if isinstance(value, Path) and value.exists() else value
    return key


def config_arg(p: argparse.ArgumentParser) -> None:
    """--config FILE, for a command whose settings are many (the training commands)."""
    p.add_argument("--config", type=Path, default=None, metavar="FILE",
                   help="a JSON or TOML file of this command's settings, keyed by flag without its dashes "
                        "(\"train-file\", \"lr\"; a switch as true or false); a flag given on the command line "
                        "overrides the file")


def config_tokens(path: Path) -> list[str]:
    """The settings of a --config file as the flags that say the same."""
    from odqa.common.io import InputError
    values = read_settings_file(path, f"--config {path}")
    tokens = []
    for key, value in values.items():
        flag = "--" + key.replace("_", "-")
        if value is None:
            continue
        if isinstance(value, bool):   # a switch: --x / --no-x, and a --no-x switch given or not
            if flag.startswith("--no-"):
                tokens += [flag] if value else []
            else:
                tokens.append(flag if value else "--no-" + flag[2:])
        elif isinstance(value, list):
            tokens += [flag, *map(str, value)]
        elif isinstance(value, (int, float, str)):
            tokens += [flag, str(value)]
        else:
            raise InputError(f"--config {path}: {key} is a {type(value).__name__}, not a value a flag takes")
    return tokens


def expand_config(argv: list[str]) -> tuple[list[str], tuple[Path, list[str]] | None]:
    """`argv` with a --config file's settings put right after the command's name, so that the command
    line's own flags, coming later, override them (argparse keeps a flag's last value); and (the file,
    its tokens), to name the file when one of them is not the command's."""
    at = next((i for i, t in enumerate(argv) if t == "--config" or t.startswith("--config=")), None)
    if at is None:
        return argv, None
    path = Path(argv[at].split("=", 1)[1] if "=" in argv[at] else (argv[at + 1] if at + 1 < len(argv) else ""))
    if not str(path) or str(path) == ".":
        return argv, None   # argparse names the missing value
    tokens = config_tokens(path)
    command_at = next(i for i, t in enumerate(argv) if not t.startswith("-"))
    return argv[:command_at + 1] + tokens + argv[command_at + 1:], (path, tokens)
