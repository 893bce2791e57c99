"""What the settings dataclasses of every package share, tevatron-style: fields that carry their help
(`odqa.system.commands.args` makes one flag per field), sections, the settings many commands share, and
`OptimArgs`, every trainer's loop. No torch here: building the CLI's parser imports this.

Each setting is declared once, in the class of its concern; a class that needs another default
inherits it (`override`). A larger class holds another whole as a *section* (ColBERT's `ColBERTConfig`):
its settings keep their flat names in flags, --config files, pipeline records and overrides (`from_flat`,
`updated`, `flat`), a holder may rename one (`ReaderArgs.reading`'s batch_size is --eval-batch-size), and
a recipe, whose sections share names, sets each in a table of its own.

Field metadata: "help"; "flag" (not --field-name) or "positional"; "aliases", old spellings still taken
with a deprecation line; "choices"; "range" (positive, non_negative, percent, port, share, text), which the
flag's parser and `check_ranges` (for settings made in Python) enforce; "input", what a command reads or
writes rather than a setting; "required", an input its flag must give though Python may leave it None
until a recipe fills it in; "section"; "tuned", what training sets and a checkpoint keeps, no flag.
"""
from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from odqa.common.io import InputError
from odqa.common.paths import CONFIG_DIR
from odqa.common.tracking import REPORT_TO


def arg(default=None, help: str = "", **meta):
    """A settings field with a default and its help text (and flag metadata)."""
    return field(default=default, metadata={"help": help, **meta})


def required(help: str, **meta):
    """An input with no default: its flag is required."""
    return field(metadata={"help": help, "input": True, **meta})


def path(default=None, help: str = "", **meta):
    """An input (a file, a directory, a checkpoint, a question set) with a default, often None: the
    default pipeline's or the default corpus. `required=True`: its flag must be given, though Python
    may leave it None until a recipe fills it in."""
    return field(default=default, metadata={"help": help, "input": True, **meta})


def listed(default: list, help: str, **meta):
    """A list-valued settings field (a flag taking several values)."""
    return field(default_factory=lambda: list(default), metadata={"help": help, **meta})


def section(cls, help: str = "", rename: dict[str, str] | None = None, **values):
    """A field holding a settings class whole, by default `cls` with `values` (flat names) in place of
    its own defaults; `rename`: flat names of its fields as this tree calls them (and flags them)."""
    return field(default_factory=lambda: from_flat(cls, values),
                 metadata={"help": help, "section": cls, "rename": dict(rename or {})})


def override(base, name: str, default, **meta):
    """`base`'s field `name` with another default (and help), for a subclass whose concern needs it:
    the same setting, its range and flag, not a copy of it."""
    f = next(f for f in dataclasses.fields(base) if f.name == name)
    meta = {**f.metadata, **meta}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


def flag_of(f, name: str | None = None) -> str:
    """The command-line flag of a settings field (a positional one: its name); `name`: its flat name in
    a tree that renames it."""
    if f.metadata.get("positional"):
        return f.name
    if name is not None and name != f.name:
        return "--" + name.replace("_", "-")
    return f.metadata.get("flag", "--" + f.name.replace("_", "-"))


def is_section(f) -> bool:
    return "section" in f.metadata


def leaves(cls, rename: dict[str, str] | None = None) -> list[tuple[str, tuple[str, ...], dataclasses.Field]]:
    """(flat name, path of field names, field) of every setting of `cls`, sections opened, in order."""
    out = []
    for f in dataclasses.fields(cls):
        if is_section(f):
            for name, at, leaf in leaves(f.metadata["section"], f.metadata["rename"]):
                out.append((name, (f.name, *at), leaf))
        else:
            out.append(((rename or {}).get(f.name, f.name), (f.name,), f))
    return out


def flat_names(cls) -> dict[str, tuple[str, ...]]:
    """Each flat name of `cls`'s tree and where it lives; a tree whose flags are flat (a command's) has
    each name once, else `TypeError` names both places. (A recipe's sections share names: each is set
    in its own table.)"""
    seen: dict[str, tuple[str, ...]] = {}
    for name, at, _ in leaves(cls):
        if name in seen:
            raise TypeError(f"{cls.__name__}: {'.'.join(seen[name])} and {'.'.join(at)} are both {name!r}")
        seen[name] = at
    return seen


def from_flat(cls, values: dict, where: str = ""):
    """`cls` made from its settings by flat name (a section also by a table of its own, as TOML's
    [section] gives it), each not given keeping its default; a name that is none of its settings is
    refused, naming `where`."""
    try:
        return cls(**_changes(cls, None, dict(values), where))
    except TypeError as e:   # a required setting not given
        raise InputError(f"{where or cls.__name__}: {e}") from None


def updated(obj, values: dict | None = None, **more):
    """A copy of `obj` with the settings named (flat names, or a section's table) changed."""
    values = {**(values or {}), **more}
    return dataclasses.replace(obj, **_changes(type(obj), obj, values, "")) if values else obj


def _changes(cls, obj, values: dict, where: str, rename: dict | None = None) -> dict:
    """The arguments of `cls` (changed from `obj`, or from its defaults) that `values` sets: its own
    fields by (renamed) name, a section by its table or by flat names no other section has."""
    fields, out = dataclasses.fields(cls), {}
    own = {(rename or {}).get(f.name, f.name): f.name for f in fields if not is_section(f)}
    out.update({own[n]: values.pop(n) for n in list(values) if n in own})
    sections = [f for f in fields if is_section(f)]
    names = {f.name: {n for n, _, _ in leaves(f.metadata["section"], f.metadata["rename"])} for f in sections}
    shared = {n for f in sections for n in names[f.name] if sum(n in m for m in names.values()) > 1}
    for f in sections:
        current = getattr(obj, f.name) if obj is not None else f.default_factory()
        if isinstance(values.get(f.name), f.metadata["section"]):
            out[f.name] = values.pop(f.name)
            continue
        table = values.pop(f.name) if isinstance(values.get(f.name), dict) else {}
        table.update({n: values.pop(n) for n in names[f.name] - shared if n in values})
        if table:
            back = {v: k for k, v in f.metadata["rename"].items()}
            inner = _changes(f.metadata["section"], current, {back.get(k, k): v for k, v in table.items()},
                             f"{where}[{f.name}]")
            out[f.name] = dataclasses.replace(current, **inner)
    if values:
        said = f"; {', '.join(sorted(shared & set(values)))}: more than one section has it, so set it in a " \
               f"section's table" if shared & set(values) else ""
        raise InputError(f"{where or cls.__name__}: not settings of {cls.__name__}: {', '.join(sorted(values))} "
                         f"(its settings: {', '.join([*own, *(f'[{f.name}]' for f in sections)])}){said}")
    return out


def flat(obj) -> dict:
    """Every setting of `obj` by its flat name, sections opened (a command's tree: each name once)."""
    out = {}
    for name, at in flat_names(type(obj)).items():
        value = obj
        for part in at:
            value = getattr(value, part)
        out[name] = value
    return out


def settings_of(obj) -> dict:
    """`obj` as a stage's or a run's key is made of it: every setting, sections nested as they are
    declared, without the inputs (the files a command reads and writes, which a key names by their
    contents, not their paths)."""
    out = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if is_section(f):
            out[f.name] = settings_of(value)
        elif not f.metadata.get("input"):
            out[f.name] = value
    return out


def range_error(rule: str, value, integer: bool | None = None) -> str | None:
    """What is wrong with `value` under a field's "range" rule, as the flag's parser says it; None if nothing.
    `integer`: whether the field counts (default: whether the value is an int)."""
    if integer is None:
        integer = isinstance(value, int) and not isinstance(value, bool)
    if rule == "text":
        return None if str(value).strip() else f"must not be empty, not {value!r}"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"must be a {'whole number' if integer else 'number'}, not {value!r}"
    if said := finite_error(value):
        return said
    if rule == "percent":
        return None if 0 <= value <= 100 else f"must be between 0 and 100, not {value:g}"
    if rule == "port":
        return None if 1 <= value <= 65535 else f"must be a port, 1 to 65535, not {value}"
    if rule == "positive" and integer:
        return None if value >= 1 else f"must be at least 1, not {value}"
    if rule == "positive":
        return None if value > 0 else f"must be above 0, not {value:g}"
    if rule == "non_negative":
        return None if value >= 0 else f"must be at least 0, not {value:g}"
    if rule == "share":
        return None if 0 <= value <= 1 else f"must be between 0 and 1, not {value:g}"
    raise ValueError(f"unknown range rule {rule!r}")


def finite_error(value) -> str | None:
    """Why a float setting's value is refused, if it is NaN or infinite: every comparison with NaN is
    false, so a NaN passes any range and turns scores into NaN downstream."""
    if isinstance(value, float) and not math.isfinite(value):
        return f"must be a finite number, not {value}"
    return None


def writes_error(kind: str, path) -> str | None:
    """What is wrong with `path` as the output of a field that writes a `kind` ("file" or "dir"): an
    existing path of the other kind, as the flag's parser says it; None if nothing."""
    if Path(path).exists() and Path(path).is_dir() != (kind == "dir"):
        return (f"{path}: a {'file' if kind == 'dir' else 'directory'} is there; this writes a "
                f"{'directory' if kind == 'dir' else 'file'} of that name: give another path, or remove it")
    # the output goes in as a temporary sibling renamed onto it, made under the nearest folder that exists
    # (so a long job is refused before it runs, not when it writes)
    above = Path(path).absolute().parent
    while not above.exists() and above != above.parent:
        above = above.parent
    if not above.is_dir():
        return f"{path}: {above} is a file, so nothing can be written under it"
    if not os.access(above, os.W_OK | os.X_OK):
        return f"{path}: cannot write in {above} (permission denied)"
    return None


def check_ranges(settings) -> None:
    """Refuse a settings object whose field is outside its "range", or names an existing path of the
    other kind than the field "writes" (a file or a directory), naming the flag. Sections check
    themselves when they are made."""
    for f in dataclasses.fields(settings):
        value = getattr(settings, f.name)
        said = f.metadata.get("writes") and value is not None and writes_error(f.metadata["writes"], value)
        if said:
            raise InputError(f"{flag_of(f)} {said}")
        for one in value if isinstance(value, (list, tuple)) else [value]:
            said = finite_error(one) or ("range" in f.metadata and one is not None and
                                         range_error(f.metadata["range"], one, _counts(f)))
            if said:
                raise InputError(f"{flag_of(f)}: {said}")


def _counts(f) -> bool:
    """Whether a field holds whole numbers (its annotation, a string under `from __future__ import annotations`)."""
    kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    return "int" in kind and "float" not in kind


@dataclass(kw_only=True)
class Settings:
    """A command's settings: its fields' ranges are checked when made, in Python as from flags."""

    def __post_init__(self):
        check_ranges(self)


CORPUS_HELP = "a directory built by `odqa corpus build` (default: the default corpus, $ODQA_HOME/corpus/default)"
QUESTIONS_HELP = ("a name (nq-test, tqa-dev, ...); a JSONL, DPR .qa.csv, JSON, CSV, TSV or Parquet path, plain or "
                  "compressed; or a hub dataset hf:NAME[:CONFIG][@SPLIT] (hf:nq_open); NAME:N is its first N")

OUT = dict(flag="--out", aliases=["--out-dir"], writes="dir")   # every output directory is --out; --out-dir until 0.3
FILE_OUT = dict(writes="file")


# The settings many commands share, each declared here once; a command inherits the ones it has and
# gives them its own default (`override`).
@dataclass(kw_only=True)
class Passages:
    k: int = arg(10, "passages per question", range="positive")


@dataclass(kw_only=True)
class Limited:
    limit: int | None = arg(None, "only the first N questions", range="positive")


@dataclass(kw_only=True)
class Batched:
    batch_size: int = arg(16, "examples per forward pass", range="positive")


@dataclass(kw_only=True)
class Seeded:
    seed: int = arg(0, "seed of the draw")


@dataclass(kw_only=True)
class HeldOut:
    validation_percent: float = arg(10.0, "share of the questions held out (by question hash) for validation",
                                    range="percent")


@dataclass(kw_only=True)
class TrainExamples:
    max_train_examples: int | None = arg(None, "use only the first N training examples", range="positive")


@dataclass(kw_only=True)
class ValidationExamples:
    max_validation_examples: int | None = arg(500, "validate on the first N examples", range="positive")


@dataclass(kw_only=True)
class Fit(Batched, Seeded):
    """What any fit has, the shared loop's (`OptimArgs`) or a small model's own (the phrase filter's)."""
    epochs: int = arg(2, "passes over the training examples", range="positive")
    lr: float = arg(5e-5, "peak learning rate (AdamW, linear warm-up then linear decay)", range="positive")
    log_steps: int = arg(10, "log the loss every N steps", range="positive")
    report_to: str = arg("none", "also log the loss, learning rate and throughput every --log-steps and the "
                                 "validation figures at each evaluation to: tensorboard, wandb or mlflow (accelerate's "
                                 "trackers; local files under OUT/runs), all (those installed), or none",
                         choices=list(REPORT_TO))


BACKENDS = ("accelerate", "deepspeed")


@dataclass(kw_only=True)
class OptimArgs(Fit):
    """The settings of the one training loop (`odqa.common.trainer.train`), embedded whole in every
    trainer's settings; each trainer may give them defaults of its own. The DeepSpeed JSON's "auto"
    values are filled from these."""
    seed: int = override(Seeded, "seed", 13, help="seed of data order and initialisation")
    max_steps: int | None = arg(None, "optimizer steps (default: --epochs over the data)", range="positive")
    batch_size: int = override(Batched, "batch_size", 16, help="examples per micro-batch (per process)")
    accumulation: int = arg(1, "micro-batches per optimizer step (gradient accumulation)", range="positive")
    weight_decay: float = arg(0.01, "AdamW weight decay", range="non_negative")
    warmup_steps: int | None = arg(None, "steps of linear warm-up (default: --warmup-ratio of the steps)",
                                    range="non_negative")
    warmup_ratio: float = arg(0.1, "share of the steps spent warming the rate up, without --warmup-steps",
                               range="share")
    max_grad_norm: float = arg(1.0, "gradient clipping norm", range="positive")
    eval_steps: int = arg(0, "evaluate (and keep the best) every N steps (0: after each epoch) and at the end",
                          range="non_negative")
    save_steps: int = arg(0, "also checkpoint every N steps (a checkpoint is written after each epoch and at "
                             "the end)", range="non_negative")
    resume: bool = arg(False, "continue from OUT/checkpoint")
    backend: str = arg("accelerate", "accelerate (one process, or DDP under torchrun / accelerate launch) or "
                                     "deepspeed (ZeRO; under deepspeed, torchrun or accelerate launch)")
    deepspeed_config: str = arg(str(CONFIG_DIR / "zero2.json"), "with --backend deepspeed: the DeepSpeed JSON; "
                                                                "its \"auto\" values come from these flags")
    zero_stage: int | None = arg(None, "with --backend deepspeed: override the JSON's ZeRO stage (0-3)")
    offload: bool = arg(False, "with --backend deepspeed: optimizer (stage 3: also parameters) offloaded to CPU")
    precision: str = arg("auto", "auto: bf16 with DeepSpeed on CUDA (accelerate: its launch config), else fp32; "
                                 "or bf16 (on CPU: autocast, float32 weights), fp32")

    def __post_init__(self):
        # Refused here, before any model loads, rather than after a training step; the ranges are the
        # fields' own, a trainer's fields' (its rates, its negatives) too, and the loop's rule for a loop
        # setting a trainer gives a default of its own.
        check_ranges(self)
        own = {f.name: f for f in dataclasses.fields(self)}
        for f in dataclasses.fields(OptimArgs):
            if "range" in own[f.name].metadata:   # the trainer's own rule for it, checked above
                continue
            said = "range" in f.metadata and getattr(self, f.name) is not None and \
                range_error(f.metadata["range"], getattr(self, f.name), _counts(f))
            if said:
                raise InputError(f"{flag_of(f)}: {said}")
        if self.backend not in BACKENDS:
            raise InputError(f"--backend must be one of {', '.join(BACKENDS)}, not {self.backend!r}")
        if self.precision not in ("auto", "bf16", "fp32"):
            raise InputError(f"--precision must be auto, bf16 or fp32, not {self.precision!r}")
        if self.backend != "deepspeed" and (self.zero_stage is not None or self.offload):
            raise InputError("--zero-stage and --offload are DeepSpeed settings: add --backend deepspeed")

    def warmup(self, total_steps: int) -> int:
        return self.warmup_steps if self.warmup_steps is not None else int(self.warmup_ratio * total_steps)


def needs(settings, *names: str) -> None:
    """Refuse `settings` where an input it must have (a file a recipe fills in, from Python) is None."""
    missing = [n for n in names if getattr(settings, n) is None]
    if missing:
        fields = {f.name: f for f in dataclasses.fields(settings)}
        raise InputError(f"{type(settings).__name__} needs {', '.join(flag_of(fields[n]) for n in missing)}")


def read_settings_file(path: Path, label: str) -> dict:
    """A table of settings from a TOML (.toml) or JSON file: a training command's --config, a demo
    recipe. `label` names the file in the errors ("--config FILE", "preset FILE")."""
    import json

    import tomllib
    if not path.is_file():
        raise InputError(f"{label}: no such file")
    kind = "TOML" if path.suffix == ".toml" else "JSON"
    try:
        text = path.read_text(encoding="utf-8")
        values = tomllib.loads(text) if kind == "TOML" else json.loads(text)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:   # TOMLDecodeError, JSONDecodeError: ValueErrors
        raise InputError(f"{label}: not valid {kind}: {e}") from None
    if not isinstance(values, dict):
        raise InputError(f"{label}: a table of settings, not {type(values).__name__}")
    return values
