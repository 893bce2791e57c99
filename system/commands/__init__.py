"""The `odqa` subcommands, one module a group: `data` (data pack, corpus, supervision, retrieval
metrics), `retrieval` (retrievers: train, dump, index, search), `reader` (FiD: init, train, read) and
`system` (demo, run, ask, serve). Each module's `add(sub)` adds its parsers; its handlers import the
heavy libraries they need when they run, so that `odqa --help` loads no torch."""
