"""Errors felixjax raises for user input it cannot handle.

Both are ``ValueError`` subclasses, so a command-line front end can catch ``ValueError`` and print
one line (exit code 2) without a traceback.

Example:
    >>> from felixjax.errors import ModelFormatError, UnsupportedModelError
    >>> issubclass(ModelFormatError, UnsupportedModelError) and issubclass(UnsupportedModelError, ValueError)
    True
"""
from __future__ import annotations


class UnsupportedModelError(ValueError):
    """The model uses something felixjax does not support (an op, an attribute value, a dtype, a
    dynamic shape). The message names the node, its op type and what is supported."""


class ModelFormatError(UnsupportedModelError):
    """The file or bytes are not a valid ONNX model (malformed, truncated, missing graph or opset)."""


class DatabaseError(ValueError):
    """A tuning database felixjax cannot use: not a felixjax database (another application's or a
    non-SQLite file, left untouched), corrupted, read-only for a write, or locked past the timeout.
    The message is one line naming the file and what to do."""
