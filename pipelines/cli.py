"""The `vlbert` command: a click group whose subcommands are thin layers over the Python API.

Expected errors (a bad config, YAML file, store, image, device or path) end a command with one
line naming the file, key or step, and exit status 2 for bad usage or 1 for a job that failed;
`--debug` (or VLBERT_DEBUG=1) shows the traceback instead. Anything else is a bug and keeps its
traceback.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import click

from extract.checkpoint import CheckpointError
from extract.config import ConfigError
from extract.detector import BoxError
from extract.device import DeviceError, StickyDeviceError
from extract.images import ImageError
from extract.job import JobError
from extract.store.schema import StoreError, StoreMismatchError
from extract.threads import configured_threads
from pipelines.commands import register
from pipelines.runner import PipelineError, StepFailed
from train.data.files import DataError
from train.engine.config import RunConfigError
from vlbert.tokenization import VocabularyError

USAGE = 2  # the command could not start as given; nothing was done
FAILED = 1  # the job ran and failed, or found problems


@dataclass(frozen=True)
class ExpectedError:
    """An exception type users cause, and the exit status it ends a command with."""

    kind: type[BaseException]
    status: int


# Checked in order: a subclass before its base class.
EXPECTED_ERRORS = (
    ExpectedError(StoreMismatchError, USAGE),
    ExpectedError(RunConfigError, USAGE),
    ExpectedError(ConfigError, USAGE),
    ExpectedError(DeviceError, USAGE),
    ExpectedError(JobError, USAGE),
    ExpectedError(PipelineError, USAGE),
    ExpectedError(CheckpointError, USAGE),
    ExpectedError(DataError, USAGE),
    ExpectedError(VocabularyError, USAGE),
    ExpectedError(StickyDeviceError, FAILED),
    ExpectedError(StoreError, FAILED),
    ExpectedError(ImageError, FAILED),
    ExpectedError(BoxError, FAILED),
    ExpectedError(OSError, FAILED),
)


def exit_status(exc: BaseException) -> int | None:
    """The exit status for an expected error; None for anything else (a bug). A failed pipeline
    step ends as its error would have."""
    if isinstance(exc, StepFailed):
        return exit_status(exc.cause)
    return next((e.status for e in EXPECTED_ERRORS if isinstance(exc, e.kind)), None)


def error_line(exc: BaseException) -> str:
    if isinstance(exc, StepFailed):
        return f"pipeline {exc.pipeline}, step {exc.step!r}: {error_line(exc.cause)}"
    if isinstance(exc, OSError) and exc.filename is not None:
        return f"{exc.filename}: {exc.strerror or exc}"
    return str(exc)


class VLBertGroup(click.Group):
    def invoke(self, ctx: click.Context):
        with warnings.catch_warnings():
            warnings.showwarning = _show_warning
            try:
                return super().invoke(ctx)
            except KeyboardInterrupt:
                if ctx.params.get("debug"):
                    raise
                click.echo("Interrupted.", err=True)
                ctx.exit(130)
            except Exception as exc:  # noqa: BLE001 - expected errors become one line, the rest re-raise
                status = exit_status(exc)
                if status is None or ctx.params.get("debug"):
                    raise
                click.echo(f"Error: {error_line(exc)}", err=True)
                ctx.exit(status)


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    click.echo(f"Warning: {message}", err=True)


@click.group(cls=VLBertGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, envvar="VLBERT_DEBUG",
              help="Show the full traceback of an error (also: VLBERT_DEBUG=1).")
def main(debug: bool) -> None:
    """VL-BERT with offline RoI features: extract, cache, convert, train."""
    click.get_current_context().with_resource(configured_threads())  # for the whole command; see extract/threads.py


register(main)
