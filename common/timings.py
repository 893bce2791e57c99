"""Where one answer's time goes: the search and the reader mark their stages (`with stage("memory"):`),
and a caller that wants the figures records them (`with recording() as seconds:`). Unrecorded, a stage
costs one context-variable lookup, so the marks stay in the serving path.

A stage's seconds are its own: time spent in a stage marked inside it (the document encoder's
question pass inside the pre-filter) counts to the inner one alone, so the stages add up to the whole.
Each thread records on its own (a context variable), so the server's concurrent batches do not mix.

A caller that stops waiting (the server's request timeout) sets a `deadline`: work inside it stops at
its next stage or decoding step once the deadline has passed, raising `PastDeadline`, rather than
computing an answer no one will read while others wait behind it.
"""
from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from contextvars import ContextVar

_recording: ContextVar[tuple[dict[str, float], list] | None] = ContextVar("odqa_stage_seconds", default=None)
_deadline: ContextVar[float | None] = ContextVar("odqa_deadline", default=None)
clock = time.perf_counter


class PastDeadline(TimeoutError):
    """Work stopped because its deadline passed: whoever asked for it has stopped waiting."""


@contextlib.contextmanager
def deadline(at: float | None) -> Iterator[None]:
    """Work inside the block stops at its next `stage` or `check_deadline` once `clock()` passes `at`
    (None: no deadline). Threads started by `asyncio.to_thread` inside it inherit it."""
    token = _deadline.set(at)
    try:
        yield
    finally:
        _deadline.reset(token)


def past_deadline() -> bool:
    at = _deadline.get()
    return at is not None and clock() > at


def check_deadline(where: str) -> None:
    if past_deadline():
        raise PastDeadline(f"stopped before {where}: past the deadline")


@contextlib.contextmanager
def stage(name: str) -> Iterator[None]:
    check_deadline(name)
    rec = _recording.get()
    if rec is None:
        yield
        return
    seconds, stack = rec
    frame = [0.0]   # time spent in stages marked inside this one
    stack.append(frame)
    start = time.perf_counter()
    try:
        yield
    finally:
        elapsed = time.perf_counter() - start
        stack.pop()
        seconds[name] = seconds.get(name, 0.0) + elapsed - frame[0]
        if stack:
            stack[-1][0] += elapsed


@contextlib.contextmanager
def recording() -> Iterator[dict[str, float]]:
    """{stage: seconds} of the stages run inside the block, filled in as they end."""
    seconds: dict[str, float] = {}
    token = _recording.set((seconds, []))
    try:
        yield seconds
    finally:
        _recording.reset(token)
