"""The Fusion-in-Decoder reader, over T5 or over an encoder-decoder warm-started from a BERT. Reads the
DPR/FiD retrieval files that retriever/ writes."""
