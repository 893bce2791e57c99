"""Retrievers: BM25 (the baseline), dense phrase retrieval, and the dense document pre-filter."""
