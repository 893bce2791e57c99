"""Two-stage batch work (common/prefetch.py): the next batch is prepared in a worker thread while the
caller holds this one, in order, never more than one ahead, and an error in the worker is raised at
the batch it came from."""
import threading

import pytest

from odqa.common.prefetch import prefetched


def test_batches_come_back_in_order_each_with_its_own_preparation():
    assert list(prefetched(lambda b: sum(b), [[1, 2], [3], [4, 5, 6]])) == [([1, 2], 3), ([3], 3), ([4, 5, 6], 15)]
    assert list(prefetched(lambda b: b, [])) == []


def test_the_next_batch_is_prepared_in_another_thread_while_the_caller_holds_this_one():
    prepared, threads, main = [], set(), threading.get_ident()
    started = {i: threading.Event() for i in range(4)}

    def prepare(b):
        threads.add(threading.get_ident())
        prepared.append(b)
        started[b].set()
        return b

    for b, _ in prefetched(prepare, range(4)):
        if b + 1 < 4:   # the next one is under way without the caller asking for it
            assert started[b + 1].wait(5)
        assert prepared == list(range(min(b + 2, 4)))   # one ahead, never more
    assert threads and main not in threads


def test_an_error_in_preparation_is_raised_at_its_batch():
    def prepare(b):
        if b == 2:
            raise ValueError(f"bad batch {b}")
        return b
    got = []
    with pytest.raises(ValueError, match="bad batch 2"):
        for b, _ in prefetched(prepare, range(5)):
            got.append(b)
    assert got == [0, 1]
