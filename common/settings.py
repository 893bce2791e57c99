"""What the settings dataclasses of every package share: fields that carry their command-line help
(tevatron-style; `odqa.system.commands.args` makes one flag per field), and the optimiser settings
that every trainer embeds. No torch here: building the CLI's parser imports this.

Field metadata: "help"; "flag" where the flag is not --field-name; "aliases" for old spellings that
still work, with a deprecation line.
"""
from __future__ import annotations

from dataclasses import dataclass, field


def arg(default=None, help: str = "", **meta):
    """A settings field with a default and its help text (and flag metadata)."""
    return field(default=default, metadata={"help": help, **meta})


def required(help: str, **meta):
    """A settings field with no default: its flag is required."""
    return field(metadata={"help": help, **meta})


def listed(default: list, help: str):
    """A list-valued settings field (a flag taking several values)."""
    return field(default_factory=lambda: list(default), metadata={"help": help})


OUT = dict(flag="--out", aliases=["--out-dir"])   # every output directory is --out; --out-dir until 0.3


@dataclass(kw_only=True)
class OptimArgs:
    """The optimiser settings every trainer embeds (AdamW with warm-up and decay, clipping); each
    trainer's settings class may give them defaults of its own."""
    epochs: int = arg(2, "passes over the training examples")
    batch_size: int = arg(16, "examples per step (per process)")
    lr: float = arg(5e-5, "peak learning rate (AdamW, warm-up then linear decay)")
    weight_decay: float = arg(0.01, "AdamW weight decay")
    max_grad_norm: float = arg(1.0, "gradient clipping norm")
    save_steps: int = arg(0, "also checkpoint every N steps (0: each epoch only)")
    seed: int = arg(13, "seed of data order and initialisation")
    resume: bool = arg(False, "continue from OUT/checkpoint")
