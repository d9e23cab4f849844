"""Generated fields: the native 8-bit decode steps (`native_steps`, with what they read
from a model in `parts`), grammar-constrained decoding of one field (`generate`), the
tokens' bytes and the vocabulary outlines-core indexes (`vocabulary`), and a value's regular
expression (`value_regex`, `text_limits`). `engine.hybrid` runs a schema's segments with
them on each context's cache.
"""
