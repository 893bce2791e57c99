"""What the settings dataclasses of every package share: fields that carry their command-line help
(tevatron-style; `odqa.system.commands.args` makes one flag per field), and the optimiser settings
that every trainer embeds. No torch here: building the CLI's parser imports this.

Field metadata: "help"; "flag" where the flag is not --field-name, or "positional"; "aliases" for old
spellings that still work, with a deprecation line; "choices"; "range" (positive, non_negative,
percent, port, text: not empty), which both the flag's parser and `check_ranges` (a dataclass's
__post_init__, for settings made in Python) enforce.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from odqa.common.io import InputError
from odqa.common.tracking import REPORT_TO


def arg(default=None, help: str = "", **meta):
    """A settings field with a default and its help text (and flag metadata)."""
    return field(default=default, metadata={"help": help, **meta})


def flag_of(f) -> str:
    """The command-line flag of a settings field (a positional one: its name)."""
    if f.metadata.get("positional"):
        return f.name
    return f.metadata.get("flag", "--" + f.name.replace("_", "-"))


def range_error(rule: str, value, integer: bool | None = None) -> str | None:
    """What is wrong with `value` under a field's "range" rule, as the flag's parser says it; None if nothing.
    `integer`: whether the field counts (default: whether the value is an int)."""
    if integer is None:
        integer = isinstance(value, int) and not isinstance(value, bool)
    if rule == "text":
        return None if str(value).strip() else f"must not be empty, not {value!r}"
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


def writes_error(kind: str, path) -> str | None:
    """What is wrong with `path` as the output of a field that writes a `kind` ("file" or "dir"): an
    existing path of the other kind, as the flag's parser says it; None if nothing."""
    if Path(path).exists() and Path(path).is_dir() != (kind == "dir"):
        return (f"{path}: a {'file' if kind == 'dir' else 'directory'} is there; this writes a "
                f"{'directory' if kind == 'dir' else 'file'} of that name: give another path, or remove it")
    return None


def check_ranges(settings) -> None:
    """Refuse a settings object whose field is outside its "range", or names an existing path of the
    other kind than the field "writes" (a file or a directory), naming the flag."""
    for f in dataclasses.fields(settings):
        value = getattr(settings, f.name)
        said = f.metadata.get("writes") and value is not None and writes_error(f.metadata["writes"], value)
        if said:
            raise InputError(f"{flag_of(f)} {said}")
        if "range" in f.metadata and value is not None:
            for one in value if isinstance(value, (list, tuple)) else [value]:
                said = range_error(f.metadata["range"], one, _counts(f))
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


def required(help: str, **meta):
    """A settings field with no default: its flag is required."""
    return field(metadata={"help": help, **meta})


def listed(default: list, help: str, **meta):
    """A list-valued settings field (a flag taking several values)."""
    return field(default_factory=lambda: list(default), metadata={"help": help, **meta})


OUT = dict(flag="--out", aliases=["--out-dir"], writes="dir")   # every output directory is --out; --out-dir until 0.3
FILE_OUT = dict(writes="file")


BACKENDS = ("accelerate", "deepspeed")
CONFIG_DIR = Path(__file__).parent / "configs"   # DeepSpeed JSONs: zero2.json, zero3_offload.json


@dataclass(kw_only=True)
class OptimArgs:
    """The settings of the one training loop (`odqa.common.trainer.train`), embedded whole in every
    trainer's settings; each trainer may give them defaults of its own. The DeepSpeed JSON's "auto"
    values are filled from these."""
    epochs: int = arg(2, "passes over the training examples", range="positive")
    max_steps: int | None = arg(None, "optimizer steps (default: --epochs over the data)", range="positive")
    batch_size: int = arg(16, "examples per micro-batch (per process)", range="positive")
    accumulation: int = arg(1, "micro-batches per optimizer step (gradient accumulation)", range="positive")
    lr: float = arg(5e-5, "peak learning rate (AdamW, linear warm-up then linear decay)", range="positive")
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
    log_steps: int = arg(10, "log the loss every N steps", range="positive")
    report_to: str = arg("none", "also log the loss, learning rate and throughput every --log-steps and the "
                                 "validation figures at each evaluation to: tensorboard, wandb or mlflow (accelerate's "
                                 "trackers; local files under OUT/runs), all (those installed), or none",
                         choices=list(REPORT_TO))
    seed: int = arg(13, "seed of data order and initialisation")
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
    except (ValueError, UnicodeDecodeError) as e:   # tomllib.TOMLDecodeError and JSONDecodeError are ValueErrors
        raise InputError(f"{label}: not valid {kind}: {e}") from None
    if not isinstance(values, dict):
        raise InputError(f"{label}: a table of settings, not {type(values).__name__}")
    return values
