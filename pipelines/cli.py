"""The `vlbert` command: a click group whose subcommands are thin layers over the Python API.

Expected errors (`vlbert.errors.UserError`: a bad config, YAML file, store, image or device; and
OSError: a path) end a command with one line naming the file, key or step, and the error's exit
status: 2 for bad usage, 1 for a job that failed;
`--debug` (or VLBERT_DEBUG=1) shows the traceback instead. Anything else is a bug and keeps its
traceback.
"""

from __future__ import annotations

import functools
import warnings
from typing import Callable

import click

from pipelines.commands import LazyGroup
from vlbert.errors import error_line, exit_status


class VLBertGroup(LazyGroup):
    def prepare(self, command: click.Command) -> click.Command:
        with_threads(command)
        return command

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


def with_threads(command: click.Command) -> None:
    """Each of `command`'s (sub)commands runs with torch's thread count set (see extract/threads.py),
    imported as it starts so that `--help` imports no torch."""
    if isinstance(command, click.Group):
        for subcommand in command.commands.values():
            with_threads(subcommand)
    elif command.callback is not None:
        command.callback = _threaded(command.callback)


def _threaded(callback: Callable) -> Callable:
    @functools.wraps(callback)
    def run(*args, **kwargs):
        from extract.threads import configured_threads

        with configured_threads():
            return callback(*args, **kwargs)
    return run

