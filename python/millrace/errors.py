"""Exceptions raised by millrace. Every message says what was wrong and what to do about it."""

from __future__ import annotations


class MillraceError(Exception):
    """Base class of every error millrace raises on purpose."""


class FormatError(MillraceError, ValueError):
    """A file is not in the format it claims to be (bad header, bad offsets, unknown dtype)."""


class TruncatedFileError(FormatError):
    """A file is shorter than its header (or the request) says it must be."""


class DTypeMismatchError(FormatError, TypeError):
    """Data has a different dtype (or shape) from the one asked for or seen in other shards."""


class DeviceUnavailableError(MillraceError, RuntimeError):
    """A CUDA device (or the library needed to use it) was asked for but is not there."""
