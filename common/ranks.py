"""Work split by rank: a stage started under `torchrun` or `accelerate launch` (one node or many:
`torchrun --nnodes`) runs once per rank, each rank on its own device, and leaves one output,
the one a single process leaves.

`split_map` is the one way a stage splits its items. They are cut into numbered batches; rank r
computes batches r, r + world, r + 2 world, ...; each finished batch is written, atomically, to
its own part file in a directory named for the stage's key, so a killed rank (or a whole job,
restarted with any number of ranks) recomputes only the batches that have no part yet. Once every
rank is done (a barrier: gloo on CPUs, NCCL on GPUs), every rank reads the parts back in batch
order, and rank 0 removes them: each rank holds the whole result, and only rank 0 writes the
stage's output (`Ranks.main`). `split_arrays` does the same for results too large to hold (a
corpus's vectors): .npy parts, handed to rank 0 alone a batch at a time.

The launchers' environment (RANK, WORLD_SIZE, LOCAL_RANK; MASTER_ADDR and MASTER_PORT for the
barrier) is read here and nowhere else.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
from dataclasses import dataclass
from datetime import timedelta
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np
from tqdm import tqdm

from odqa.common.io import InputError, atomic_path, loading, read_json
from odqa.common.prefetch import prefetched

log = logging.getLogger(__name__)

# A rank that finishes its share waits at the barrier for the slowest; hours, not gloo's 30 minutes,
# since a share of DPR's 21M passages runs that long.
BARRIER_TIMEOUT = timedelta(hours=12)


@dataclass(frozen=True)
class Ranks:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @classmethod
    def from_env(cls) -> "Ranks":
        try:
            ranks = cls(int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)),
                        int(os.environ.get("LOCAL_RANK", 0)))
        except ValueError:
            raise InputError("RANK, WORLD_SIZE and LOCAL_RANK must be integers (as torchrun sets them)") from None
        if not 0 <= ranks.rank < ranks.world:
            raise InputError(f"RANK={ranks.rank} is not a rank of WORLD_SIZE={ranks.world}")
        return ranks

    @property
    def main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        """Wait for every rank (nothing to wait for alone)."""
        if self.world > 1:
            import torch.distributed as dist
            _process_group()
            dist.barrier()


@lru_cache(maxsize=1)
def current() -> Ranks:
    """This process's rank. Under a launcher with GPUs, "cuda" means this rank's own GPU from here on
    (LOCAL_RANK: one GPU a rank on each node)."""
    ranks = Ranks.from_env()
    if ranks.world > 1:
        import torch
        if torch.cuda.is_available():
            torch.cuda.set_device(ranks.local_rank % torch.cuda.device_count())
    return ranks


@lru_cache(maxsize=1)
def _process_group() -> None:
    """The default process group, with the backend the trainers' engines choose (NCCL on GPUs, gloo on
    CPUs), so that a trainer started after a barrier (train-doc builds its answer index first) finds
    the group it would have made."""
    import torch
    import torch.distributed as dist
    if not dist.is_initialized():   # a trainer's engine may have made it already
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo", timeout=BARRIER_TIMEOUT)


def parts_beside(output: str | os.PathLike) -> Path:
    """Where a stage's finished batches wait, until merged into `output`: the hidden `.NAME.parts`
    beside it."""
    output = Path(output)
    return output.with_name(f".{output.name}.parts")


def split_map(fn: Callable[..., list], items: Sequence, batch_size: int, parts: str | os.PathLike | None,
              key: Any = None, desc: str = "batches", ranks: Ranks | None = None,
              prepare: Callable[[Sequence], Any] | None = None) -> list:
    """`fn` over `items` a batch at a time, this rank's batches only, and every rank's results in item
    order, on every rank; `fn(batch)` returns a list of one JSON-serialisable result an item.

    `parts`: the directory of the part files (`parts_beside(OUTPUT)`), resumed only when it was
    made with the same `key` (the stage's inputs and settings) and batch size, else emptied. Alone and
    without `parts`, `fn` simply runs over every batch. With `prepare`, a stage in two halves: `fn(batch,
    prepare(batch))`, the next batch's `prepare` in a worker thread meanwhile (common/prefetch.py)."""
    ranks = ranks or current()
    batches = [items[i:i + batch_size] for i in range(0, len(items), batch_size)]
    if parts is None:
        if ranks.world > 1:
            raise InputError("a stage split by rank needs a directory for its parts")
        return [r for _, out in zip(_progress(batches, desc, len(items), 0), _outputs(fn, batches, prepare))
                for r in out]
    with _one_run_at_a_time(Path(parts), ranks):
        parts = _compute(fn, batches, Path(parts), key, desc, ranks, _JSON, prepare)
        results = [r for b in range(len(batches)) for r in _read_part(parts, b, batches[b], _JSON)]
        ranks.barrier()   # every rank has read every part
        if ranks.main:
            shutil.rmtree(parts)
    return results


def split_arrays(fn: Callable[[Sequence], np.ndarray], items: Sequence, batch_size: int, parts: str | os.PathLike,
                 key: Any = None, desc: str = "batches", ranks: Ranks | None = None) -> Iterator[np.ndarray]:
    """`split_map` for arrays (`fn(batch)`: one row an item), too many to hold at once (a corpus's
    vectors): each rank computes its batches into .npy parts, and rank 0 alone is given them, a batch
    at a time in item order, to write the stage's output; the parts go once they are all read. The
    other ranks are given nothing and return once rank 0 is done."""
    ranks = ranks or current()
    batches = [items[i:i + batch_size] for i in range(0, len(items), batch_size)]
    with _one_run_at_a_time(Path(parts), ranks):
        parts = _compute(fn, batches, Path(parts), key, desc, ranks, _NPY)
        if ranks.main:
            for b in range(len(batches)):
                yield _read_part(parts, b, batches[b], _NPY)
            shutil.rmtree(parts)
    ranks.barrier()   # the output is complete before any rank goes on to read it


@contextlib.contextmanager
def _one_run_at_a_time(parts: Path, ranks: Ranks) -> Iterator[None]:
    """Hold `parts` for this run (its rank 0 holds the lock; its other ranks wait for it at the first
    barrier): a second run of the same stage into the same output (`odqa retrieve` started twice) waits
    for the first to finish and then computes its own, where it once died on the first one's parts
    vanishing under it. Each run publishes whole; the last one's output stays. The lock file goes with
    the lock."""
    if not ranks.main:
        yield
        return
    lock = parts.with_name(f"{parts.name}.lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    while True:
        fd = os.open(lock, os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.warning("another run is writing %s: waiting for it to finish", parts.name.removeprefix(".")
                        .removesuffix(".parts"))
            fcntl.flock(fd, fcntl.LOCK_EX)
        try:   # the holder before us removes the file as it lets go: a lock on that removed file holds nothing
            ours = os.stat(lock).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            ours = False
        if ours:
            break
        os.close(fd)
    try:
        yield
    finally:
        os.unlink(lock)
        os.close(fd)


def _save_npy(path: Path, rows) -> None:
    with open(path, "wb") as f:   # a file object: np.save would add ".npy" to the temporary's name
        np.save(f, np.asarray(rows))


# (suffix, save, load) of a part file
_JSON = ("json", lambda path, rows: path.write_text(json.dumps(rows, ensure_ascii=False)),
         lambda path: json.loads(path.read_text(encoding="utf-8")))
_NPY = ("npy", _save_npy, lambda path: np.load(path, allow_pickle=False))


def _compute(fn, batches: list, parts: Path, key, desc: str, ranks: Ranks, kind, prepare=None) -> Path:
    """This rank's batches of `fn` into `parts` (those not there already); returns once every rank's are."""
    stamp = json.loads(json.dumps({"key": key, "batches": [len(b) for b in batches]}, default=str))
    if ranks.main:
        if parts.is_dir() and _stamp(parts) != stamp:
            log.info("%s was made with other inputs or settings: starting again", parts)
            shutil.rmtree(parts)
        parts.mkdir(parents=True, exist_ok=True)
        if not (parts / "stamp.json").exists():
            with atomic_path(parts / "stamp.json") as tmp:
                tmp.write_text(json.dumps(stamp))
    ranks.barrier()   # no rank writes a part into a directory that rank 0 is about to empty
    mine = range(ranks.rank, len(batches), ranks.world)
    done = {b for b in mine if _part(parts, b, kind).exists()}
    if done:
        log.info("%s: %d of this rank's %d batches already done; resuming", parts, len(done), len(mine))
    todo = [b for b in mine if b not in done]
    label = desc if ranks.world == 1 else f"{desc} (rank {ranks.rank} of {ranks.world})"
    progress = _progress(todo, label, sum(len(batches[b]) for b in mine), sum(len(batches[b]) for b in done),
                         [len(batches[b]) for b in todo])
    for b, out in zip(progress, _outputs(fn, [batches[b] for b in todo], prepare)):
        with atomic_path(_part(parts, b, kind)) as tmp:
            kind[1](tmp, out)
    ranks.barrier()
    return parts


def _read_part(parts: Path, b: int, batch, kind):
    path = _part(parts, b, kind)
    with loading(path, "a finished batch"):
        part = kind[2](path)
    if len(part) != len(batch):
        raise InputError(f"{path} holds {len(part)} results for {len(batch)} items: remove {parts}")
    return part


def _progress(seq: list, desc: str, total: int, initial: int, sizes: list[int] | None = None):
    """`seq`, with a bar counting items; without a terminal (a log file), a line every tenth of the way."""
    bar = tqdm(total=total, initial=initial, desc=desc, unit=" items", disable=None, mininterval=2)
    every, n = max(1, len(seq) // 10), initial
    for i, x in enumerate(seq):
        if bar.disable and i % every == 0:
            log.info("%s: %d of %d done", desc, n, total)
        yield x
        step = sizes[i] if sizes is not None else len(x)
        bar.update(step)
        n += step
    bar.close()


def _outputs(fn, batches: list, prepare=None) -> Iterator[list]:
    """`fn` of each batch in turn, computed as it is asked for; with `prepare`, `fn(batch, prepared)`."""
    if prepare is None:
        return (_checked(fn, batch) for batch in batches)
    return (_checked(fn, batch, prepared) for batch, prepared in prefetched(prepare, batches))


def _checked(fn, batch, *prepared):
    out = fn(batch, *prepared)
    if len(out) != len(batch):
        raise RuntimeError(f"a stage gave {len(out)} results for a batch of {len(batch)}")
    return out


def _part(parts: Path, b: int, kind) -> Path:
    return parts / f"batch-{b:07d}.{kind[0]}"


def _stamp(parts: Path) -> dict | None:
    try:
        return read_json(parts / "stamp.json")
    except (OSError, ValueError):
        return None
