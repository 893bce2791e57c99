"""Reader checkpoints as they are published, loaded whole or not at all.

facebookresearch/FiD saves its readers (NQ and TriviaQA, base and large) after `wrap_encoder`: the T5
encoder sits inside an `EncoderWrapper` and each of its blocks inside a `CheckpointWrapper`, so their
keys read `encoder.encoder.block.N.module.*` (and `encoder.encoder.final_layer_norm.*`), in one
`pytorch_model.bin`, with no tokenizer. `FiDT5` adds no weights, so such a checkpoint is a plain T5's
weights under other names: `fid_to_t5` renames them back.

Every reader load goes through `load_weights`, which refuses a checkpoint with a weight missing,
unexpected or of another shape, naming them: transformers would initialise the missing ones at random
and only warn ("Pierre C" for "Pierre" on every question of a FiD checkpoint loaded as a plain T5).
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import torch

from odqa.common.io import InputError, loading
from odqa.common.weights import from_pretrained_whole, read_state_dict, refuse_misfit, weight_file

FID_BLOCK = re.compile(r"^encoder\.encoder\.block\.(\d+)\.module\.")
# T5 sizes by width, as FiD's readers were made from them: the tokenizer a FiD checkpoint does not ship
T5_BY_WIDTH = {512: "t5-small", 768: "t5-base", 1024: "t5-large"}


def is_fid_layout(keys) -> bool:
    return any(FID_BLOCK.match(k) for k in keys)


def fid_to_t5(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """FiD's wrapped-encoder keys as a plain T5's: `encoder.encoder.block.N.module.x` -> `encoder.block.N.x`,
    `encoder.encoder.x` -> `encoder.x`; every other key as it is."""
    renamed = {}
    for key, value in state.items():
        key = FID_BLOCK.sub(r"encoder.block.\1.", key)
        renamed[re.sub(r"^encoder\.encoder\.", "encoder.", key)] = value
    return renamed


def load_weights(cls, name: str, config):
    """`cls` (a FiD class) with the checkpoint's weights, every one of them: FiD's layout is renamed
    first; any weight missing, unexpected or mismatched is an InputError naming them."""
    file = weight_file(name)
    state = read_state_dict(file, "the reader's weights") if file is not None and file.suffix == ".bin" else {}
    if not is_fid_layout(state):
        return from_pretrained_whole(cls, name, "the reader's weights")
    with loading(name, "the reader's weights"):
        model = cls(config)
        result = model.load_state_dict(fid_to_t5(state), strict=False)
        model.tie_weights()
    refuse_misfit(name, "the reader's weights", _untied(model, result.missing_keys), result.unexpected_keys)
    return model


def _untied(model, missing: list[str]) -> list[str]:
    """The missing keys that are not another loaded weight under a tied name (T5's embed_tokens, lm_head)."""
    names_of: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names_of.setdefault(id(param), []).append(name)
    lost = set(missing)
    return [k for k in missing if not any(other not in lost for group in names_of.values() if k in group
                                          for other in group)]


def has_tokenizer(path: str | os.PathLike) -> bool:
    return any((Path(path) / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "spiece.model"))


def tokenizer_source(name: str, config, tokenizer_path: str | os.PathLike | None) -> str:
    """Where the reader's tokenizer comes from: `tokenizer_path`, else the checkpoint's own, else (a T5
    directory without one, as FiD's checkpoints are) the T5 of its width. A directory without tokenizer
    files never goes to `AutoTokenizer` itself, which would make an empty tokenizer of its config (104
    tokens, every word unknown) and read garbage without a word."""
    if tokenizer_path is not None:
        return str(tokenizer_path)
    if not Path(name).is_dir() or has_tokenizer(name):
        return name
    size = T5_BY_WIDTH.get(getattr(config, "d_model", None)) if config.model_type == "t5" else None
    if size is None:
        raise InputError(f"{name} holds no tokenizer: pass --tokenizer DIR, the tokenizer the model was trained "
                         f"with, or save it beside the model")
    return size


def load_tokenizer(name: str, config, tokenizer_path: str | os.PathLike | None):
    from transformers import AutoTokenizer
    source = tokenizer_source(name, config, tokenizer_path)
    if Path(source).is_dir() and not has_tokenizer(source):
        raise InputError(f"--tokenizer {source}: no tokenizer files there (tokenizer.json, tokenizer_config.json, "
                         f"spiece.model)")
    with loading(source, "the reader's tokenizer"):
        return AutoTokenizer.from_pretrained(source)
