"""The Fusion-in-Decoder T5 reader (issue 4). Reads DPR/FiD retrieval files written by retriever/."""
