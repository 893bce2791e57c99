"""odqa: open-domain question answering with dense phrase retrieval, a document pre-filter and a
Fusion-in-Decoder reader.

The installed distribution holds this one package. Its subpackages live in the repository's top-level
folders (pyproject.toml maps them): odqa.common (common/), odqa.retriever (retriever/), odqa.reader
(reader/) and odqa.system (system/). Data flows one way: system -> retriever, reader -> common.
"""
__version__ = "0.1.0"
