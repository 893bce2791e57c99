"""odqa: open-domain question answering with dense phrase retrieval, a document pre-filter and a
Fusion-in-Decoder reader.

    import odqa
    qa = odqa.load()                                  # the pipeline `odqa demo` built last
    print(qa.ask("who wrote hamlet").generated)

`load(name_or_path="default")` takes the default pipeline, a pipeline directory or a pipeline.json
and returns an `odqa.system.pipeline.Pipeline` (`ask`, `search`, `read`); results are the frozen
dataclasses `Answer`, `Phrase`, `Passage`, `Document` (`to_dict`, `from_dict`). Importing odqa loads
no model and no torch: `load` does.

The installed distribution holds this one package. Its subpackages live in the repository's top-level
folders (pyproject.toml maps them): odqa.common (common/), odqa.retriever (retriever/), odqa.reader
(reader/) and odqa.system (system/). Data flows one way: system -> retriever, reader -> common.
"""
from odqa.common.results import Answer, Document, Neighbour, Passage, Phrase

__version__ = "0.1.0"
__all__ = ["load", "Answer", "Document", "Neighbour", "Passage", "Phrase", "__version__"]


def load(name_or_path="default", device=None, **settings):
    """The pipeline named: "default" (what `odqa demo` recorded in $ODQA_HOME/pipeline.json), a
    directory holding a pipeline.json, or such a file; `settings` are search or reader settings
    (`Pipeline.ask` takes the same). Returns an `odqa.system.pipeline.Pipeline`."""
    from odqa.system.pipeline import load as load_pipeline
    return load_pipeline(name_or_path, device, **settings)
