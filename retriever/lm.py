"""Loading the BERT-family language models, tokenizers and JSON configs that the phrase, document and
dense encoders are made of, so that a checkpoint that is missing, truncated, malformed or of the wrong
kind is refused with its path (an InputError) wherever it is read."""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from collections.abc import Iterator
from pathlib import Path

from torch import nn
from transformers import AutoModel, AutoTokenizer

from odqa.common.io import InputError, atomic_path, loading, read_json
from odqa.common.weights import UNUSED_EXTRA, UNUSED_MISSING, check_sealed, from_pretrained_whole, seal


def load_lm(name_or_path: str | os.PathLike, **kwargs) -> nn.Module:
    """AutoModel.from_pretrained, for an encoder-only (BERT-family) model: token vectors come from its
    last hidden state, which an encoder-decoder's forward does not give without decoder inputs. Any
    other weight missing, unexpected or misshapen is refused by name (`common/weights.py`)."""
    lm = from_pretrained_whole(AutoModel, name_or_path, "a language model's weights",
                               may_lack=UNUSED_MISSING, may_add=UNUSED_EXTRA, **kwargs)
    if getattr(lm.config, "is_encoder_decoder", False) or not hasattr(lm.config, "hidden_size"):
        raise InputError(f"{name_or_path}: a {lm.config.model_type!r} model; the phrase and question encoders need "
                         "an encoder-only (BERT-family) one")
    return lm


def load_tokenizer(path_or_name: str | os.PathLike):
    """The tokenizer of a checkpoint: its `tokenizer/` subdirectory where it has one (the encoders save
    it there, beside their LMs), else the checkpoint itself or a hub name."""
    path = Path(path_or_name)
    source = path / "tokenizer" if (path / "tokenizer").exists() else path_or_name
    with loading(source, "a tokenizer"):
        return AutoTokenizer.from_pretrained(source)


def read_config(path: Path, cls, required: tuple[str, ...] = ("encoder",)):
    """A config dataclass from its JSON file; a malformed file, a missing or unknown key, or a value the
    dataclass refuses is an InputError naming the file."""
    fields = {f.name for f in dataclasses.fields(cls)}
    raw = read_json(path)
    if not isinstance(raw, dict):
        raise InputError(f"{path}: expected a JSON object")
    problems = [f"no {key!r}" for key in required if key not in raw]
    problems += [f"unknown key {key!r}" for key in sorted(set(raw) - fields)]
    if problems:
        raise InputError(f"{path}: {'; '.join(problems)}")
    try:
        return cls(**raw)
    except (TypeError, ValueError) as e:
        raise InputError(f"{path}: {e}") from None


@contextlib.contextmanager
def saving_checkpoint(out_dir: str | os.PathLike, lms: dict[str, nn.Module | None], config, config_name: str,
                      tokenizer=None) -> Iterator[Path]:
    """Write an encoder checkpoint atomically: each LM a plain HF checkpoint in a folder of its name,
    the config dataclass as `config_name`, the tokenizer in tokenizer/; yields the directory being
    written, for the files of the encoder's own (its heads)."""
    with atomic_path(out_dir) as tmp:
        tmp.mkdir()
        for name, lm in lms.items():
            if lm is not None:
                lm.save_pretrained(tmp / name)
        (tmp / config_name).write_text(json.dumps(dataclasses.asdict(config), indent=2))
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp / "tokenizer")
        yield tmp
        seal(tmp)


def open_checkpoint(path: str | os.PathLike, config_name: str, cls, names: tuple[str, ...], what: str):
    """(config, {name: LM}) of a checkpoint `saving_checkpoint` wrote; LMs it does not hold are left out."""
    path = Path(path)
    if not (path / config_name).exists():
        raise InputError(f"{path} is not a {what} checkpoint (no {config_name})")
    check_sealed(path, what)
    return read_config(path / config_name, cls), {name: load_lm(path / name) for name in names if (path / name).exists()}
