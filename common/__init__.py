"""Formats, metrics and the data pack shared by retriever/, reader/ and system/.

Nothing in here imports those packages: data flows system -> retriever, reader -> common.
"""
