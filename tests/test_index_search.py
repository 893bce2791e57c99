"""Whole-index phrase search over the memory-mapped codes (PhraseIndex.search, IVFPQCodes.search): the
hits faiss's own IVF-PQ search finds over the same codes, and memory that does not grow with the index."""
import subprocess
import sys

import faiss
import numpy as np
import pytest
from search_helpers import index_of
from tiny_data import both_sides_copy, synthetic_dump

from odqa.retriever.phrase_index import PhraseIndex


@pytest.mark.parametrize("factory", ["OPQ8,IVF32,PQ8", "IVF32,PQ8"])
def test_whole_index_search_finds_what_faiss_finds_in_its_own_lists(tmp_path, factory):
    dump, corpus = synthetic_dump(tmp_path, 800, 10, 32)
    index_of(dump, tmp_path / "index", corpus, factory=factory, train_size=8000)
    assert (tmp_path / "index" / "start.order.npy").exists()
    q = np.random.default_rng(1).standard_normal((100, 32), dtype=np.float32)
    for nprobe in (1, 4, 32):
        ix = PhraseIndex(tmp_path / "index", nprobe=nprobe)
        scores, ids = ix.search("start", q, 10)
        reference = faiss.clone_index(ix._faiss["start"])       # faiss's lists, filled from the same codes
        ix._codes["start"].fill(reference)
        faiss.extract_index_ivf(reference).nprobe = nprobe
        ref_scores, ref_ids = reference.search(q, 10)
        same = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(ids, ref_ids)])
        assert same >= 0.99, (nprobe, same)     # float sums in another order may swap a tie at the 10th place
        assert np.allclose(scores, ref_scores, rtol=1e-4, atol=1e-4)
        assert not ix._faiss["start"].ntotal     # faiss's lists were never filled
        # each hit's score is the one scoring by id gives (the pre-filter's path)
        assert np.allclose(scores[0], ix.scores("start", ids[0], q[0]), rtol=1e-4, atol=1e-4)


def test_an_index_of_shared_sides_holds_one_and_searches_it_for_both(tmp_path):
    """A dump whose start and end are one vector (DensePhrases' models) is indexed once: the end query
    searches the start side's codes, as an index holding both copies would answer."""
    dump, corpus = synthetic_dump(tmp_path, 800, 10, 32, shared_sides=True)
    twin = both_sides_copy(dump, tmp_path / "twin")
    index_of(dump, tmp_path / "index", corpus, factory="IVF32,PQ8", train_size=8000)
    index_of(twin, tmp_path / "index2", corpus, factory="IVF32,PQ8", train_size=8000)
    files = {p.name for p in (tmp_path / "index").iterdir()}
    assert "start.codes.npy" in files and not any(name.startswith("end.") for name in files)
    one, two = PhraseIndex(tmp_path / "index"), PhraseIndex(tmp_path / "index2")
    assert one.manifest["sides"] == ["start"] and two.manifest["sides"] == ["start", "end"]
    q = np.random.default_rng(1).standard_normal((20, 32), dtype=np.float32)
    for side in ("start", "end"):
        scores, ids = one.search(side, q, 10)
        ref_scores, ref_ids = two.search(side, q, 10)
        assert (ids == ref_ids).all() and np.allclose(scores, ref_scores, rtol=1e-5, atol=1e-5)
        assert np.allclose(one.scores(side, ids[0], q[0]), scores[0], rtol=1e-4, atol=1e-4)
        assert np.array_equal(one.vectors(side, ids[0]), two.vectors(side, ids[0]))


CHILD = """
import sys
import numpy as np
from odqa.retriever.ivfpq_codes import IVFPQCodes
from odqa.retriever.phrase_index import PhraseIndex

IVFPQCodes.SCAN_BLOCK = 256   # below both sizes' list lengths: the scan's work is a block's at both
def anon_kb():
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("RssAnon"))

ix = PhraseIndex(sys.argv[1], nprobe=10**6)    # every list: every code is read
q = np.random.default_rng(0).standard_normal((64, ix.manifest["dim"]), dtype=np.float32)
ix.search("start", q[:2], 10)                   # warm-up: each side's list bounds
ix.search("end", q[:2], 10)
before = anon_kb()
for _ in range(3):
    ix.search("start", q, 10)
    ix.search("end", q, 10)
print(anon_kb() - before)
"""


def test_whole_index_search_memory_does_not_grow_with_the_index(tmp_path):
    """Anonymous memory (not the page cache, which the codes' memory map fills and every process
    shares) after searching every list of both sides: the same at 4x the vectors, since a list is
    scanned a block at a time. Filling faiss's lists, as search once did, holds 24 bytes a vector
    more: 7 MB at the larger size."""
    grown = {}
    for passages in (2_500, 10_000):
        root = tmp_path / str(passages)
        root.mkdir()
        dump, corpus = synthetic_dump(root, passages, 15, 64)
        index_of(dump, root / "index", corpus, factory="IVF64,PQ8", train_size=20_000)
        done = subprocess.run([sys.executable, "-c", CHILD, str(root / "index")], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        grown[passages] = int(done.stdout.split()[-1])
    filled = 24 * 10_000 * 15 * 2 // 1024   # what faiss's lists of both sides would hold, in KB
    assert grown[10_000] - grown[2_500] < filled / 10, grown
