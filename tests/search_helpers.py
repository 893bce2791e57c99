"""The search as the tests make it: an index of every dumped token in one exact (Flat) index unless
told otherwise, and a searcher by settings named as `Pipeline.ask` takes them."""
from odqa.common.settings import updated
from odqa.retriever.args import BuildIndexArgs
from odqa.retriever.index_build import build_index
from odqa.retriever.search_config import SearchConfig
from odqa.retriever.searcher import Searcher


def index_of(dump, out, corpus, factory="Flat", keep=1.0, **args) -> dict:
    """`build_index` of a dump: Flat and every token (keep 1) unless given."""
    return build_index(BuildIndexArgs(dump=dump, out=out, corpus=corpus, factory=factory, keep=keep, **args))


def searcher_of(index, model, corpus, doc_index=None, doc_model=None, *, reranker=None, memory=None, dtype=None,
                **settings) -> Searcher:
    """`Searcher.open` searching by `SearchConfig` with `settings` (flat names) in place of its defaults."""
    return Searcher.open(index, model, corpus, doc_index, doc_model, updated(SearchConfig(), settings),
                         reranker=reranker, memory=memory, dtype=dtype)
