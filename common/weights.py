"""Model weights loaded whole or not at all, and checkpoints checked against the checksums odqa sealed
them with.

transformers' `from_pretrained` initialises a weight the checkpoint lacks at random and only warns, so a
checkpoint of another layout (FiD's wrapped encoder, DensePhrases' three encoders in one file, a DPR
context encoder taken as a question encoder) would load and answer wrongly without a word. Every model
load goes through here and refuses such a checkpoint, naming the keys.
"""
from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from odqa.common.io import InputError, check_checksums, file_sha256, loading, read_json, write_json

# Weights a BERT-family encoder may lack or carry beyond it and still be whole: its users (the
# retriever's encoders, the warm-started reader) read the last hidden state, so a BERT's pooler (which
# SpanBERT's and some sentence encoders' checkpoints lack) is never used, nor a pretraining
# checkpoint's heads (bert-base-uncased's `cls.` heads).
UNUSED_MISSING = ("pooler.",)
UNUSED_EXTRA = ("cls.", "lm_head.", "pooler.")

SHOWN = 5   # keys named in an error, of each kind
CHECKSUMS = "checksums.json"   # in every checkpoint odqa writes: {relative path: {"bytes", "sha256"}}


def seal(directory: str | os.PathLike) -> None:
    """Record the size and sha256 of every file of a checkpoint directory (its subdirectories too) in
    its CHECKSUMS, the last file written: a checkpoint damaged later is refused by name on loading."""
    directory = Path(directory)
    files = sorted(p for p in directory.rglob("*") if p.is_file() and p.name != CHECKSUMS)
    write_json(directory / CHECKSUMS, {p.relative_to(directory).as_posix(): {"bytes": p.stat().st_size,
                                                                             "sha256": file_sha256(p)} for p in files})


def check_sealed(directory: str | os.PathLike, what: str, whole: bool = False) -> bool:
    """Refuse (an InputError naming the file) a checkpoint whose files differ from its CHECKSUMS: every
    size and every byte (a published t5-base reader is some 900 MB), each file hashed once and remembered
    by its size, inode and times (`remembered_sha256`), and hashed anew by `whole` (`odqa verify`). False for a directory odqa did not seal (a hub or T5 checkpoint), which loads
    as it is."""
    directory = Path(directory)
    if not (directory / CHECKSUMS).is_file():
        return False
    recorded = read_json(directory / CHECKSUMS)   # its shape is checked_record's to check, with the files
    check_checksums(directory, {"files": recorded}, what, state="damaged", record=CHECKSUMS,
                    advice="restore it or train it again", hash_up_to=None, remember=not whole)
    return True


def weight_file(path: str | os.PathLike) -> Path | None:
    """A checkpoint directory's single weight file (safetensors first), or None (a hub name, or shards)."""
    for name in ("model.safetensors", "pytorch_model.bin"):
        if (Path(path) / name).is_file():
            return Path(path) / name
    return None


def read_state_dict(path: Path, what: str = "the weights") -> dict[str, torch.Tensor]:
    """A weight file's tensors: a `pytorch_model.bin` memory-mapped (its keys are read without its
    tensors), a `model.safetensors` through safetensors."""
    with loading(path, what):
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file
            return load_file(path)
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)


def weight_keys(path: Path) -> list[str]:
    """A weight file's keys, without reading its tensors."""
    if path.suffix != ".safetensors":
        return list(read_state_dict(path))
    from safetensors import safe_open
    with loading(path, "the weights"), safe_open(path, "pt") as f:
        return list(f.keys())


def refuse_misfit(name, what: str, missing: Iterable[str] = (), unexpected: Iterable[str] = (),
                  mismatched: Iterable[str] = ()) -> None:
    """An InputError naming the weights that do not fit, if any do not."""
    said = [f"{kind} {len(keys)} ({', '.join(keys[:SHOWN])}{', ...' if len(keys) > SHOWN else ''})"
            for kind, keys in (("missing", sorted(missing)), ("unexpected", sorted(unexpected)),
                               ("of another shape", sorted(mismatched)))
            if keys]
    if said:
        raise InputError(f"{name}: {what} do not fit its config, weights {'; '.join(said)}: a checkpoint of another "
                         f"model or layout, or a damaged one (none was initialised at random)")


@contextmanager
def quiet_loading() -> Iterator[None]:
    """transformers' report of a load, whose "newly initialized" `refuse_misfit` makes untrue, and its
    "Loading weights" bar (one a checkpoint, over in milliseconds: six above a one-line `odqa ask` or
    `odqa.load().ask`), both hidden for the block and then put back as they were. A download from the
    hub keeps its own bar."""
    from transformers.utils import logging as hf_logging
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    hook = hf_logging.set_tqdm_hook(lambda factory, args, kwargs: factory(*args, **{**kwargs, "disable": True}))
    try:
        yield
    finally:
        hf_logging.set_tqdm_hook(hook)
        hf_logging.set_verbosity(verbosity)


def from_pretrained_whole(cls, name: str | os.PathLike, what: str, may_lack: tuple[str, ...] = (),
                          may_add: tuple[str, ...] = (), **kwargs):
    """`cls.from_pretrained(name)`, refused (`refuse_misfit`) unless every weight is loaded. Keys under
    the prefixes `may_lack` may be missing and those under `may_add` unexpected: parts the caller never
    uses (a BERT's pooler, a pretraining checkpoint's `cls.` heads)."""
    # mismatched shapes come back in the info (and are refused) rather than as transformers' report
    with quiet_loading(), loading(name, what):
        model, info = cls.from_pretrained(name, output_loading_info=True, ignore_mismatched_sizes=True, **kwargs)
    refuse_misfit(name, what,
                  [k for k in info.get("missing_keys", ()) if not k.startswith(may_lack)],
                  [k for k in info.get("unexpected_keys", ()) if not k.startswith(may_add)],
                  [k if isinstance(k, str) else k[0] for k in info.get("mismatched_keys", ())])
    return model
