"""Two-stage batch work, overlapped: `prepare(batch)` for the next batch runs in a worker thread while
the caller works on this one. It pays where `prepare` spends its time in code that lets go of the GIL
(torch, faiss, numpy's array work) and the caller's half is Python: a phrase search's encoders and
index products against the text it reads for its hits (docs/notes/speed.md).

Only one batch is prepared ahead, so memory stays at two batches'. The worker does not see the
caller's context variables (a stage's recorded timings, a deadline), so it is for batch jobs, not for
a request's answer.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
P = TypeVar("P")
_END = object()   # what `next` gives once the batches run out


def prefetched(prepare: Callable[[T], P], batches: Iterable[T]) -> Iterator[tuple[T, P]]:
    """(batch, prepare(batch)) for each batch in order, the next one's prepared while the caller holds
    this one's. An error in `prepare` is raised here, at the batch it came from."""
    it = iter(batches)
    with ThreadPoolExecutor(1, thread_name_prefix="prefetch") as pool:
        nxt = next(it, _END)
        ahead = pool.submit(prepare, nxt) if nxt is not _END else None
        while ahead is not None:
            batch, prepared = nxt, ahead.result()
            nxt = next(it, _END)
            ahead = pool.submit(prepare, nxt) if nxt is not _END else None
            yield batch, prepared

