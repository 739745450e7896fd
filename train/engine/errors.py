"""The errors of a training run's config, in a module of their own that imports nothing heavy: pipeline
step kinds raise them when a pipeline loads, in processes that may never train."""

from __future__ import annotations

from vlbert.utils.errors import UserError


class RunConfigError(UserError):
    """A run config that cannot be used: YAML, unknown or mistyped fields, missing paths, a stage the
    store cannot feed. The message names the file or field."""


class RunMismatchError(RunConfigError):
    """A run folder that holds a run with another config; the message lists every difference."""
