"""User-facing errors. The CLI prints each as one line and exits non-zero; no traceback."""

from __future__ import annotations


class KvopsError(Exception):
    """A problem with the user's input or environment, stated in one line."""

    exit_code = 1


class UsageError(KvopsError):
    """A bad option value (the same exit status as click's usage errors)."""

    exit_code = 2


class ModelNotFound(KvopsError):
    """No config.json for a model argument: not a path, not in the HF cache, not in the catalog."""


class ConfigError(KvopsError):
    """A config.json that lacks, or has an unusable, field the formula needs."""


class MissingDevice(UsageError):
    """A plan that needs the device's memory was given neither --gpu nor --gpu-memory."""
