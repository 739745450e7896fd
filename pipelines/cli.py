"""The `vlbert` command: a click group whose subcommands are thin layers over the Python API.

Errors a user causes (`vlbert.utils.errors.UserError`: a bad config, YAML file, store, image, device or
path) end a command with one line naming the file, key or step, and their exit status: 2 for bad
usage, 1 for a job that failed; `--debug` (or VLBERT_DEBUG=1) shows the traceback instead. Anything
else is a bug and keeps its traceback. A command's module is imported when the command is asked
for, and commands import what they run when they run, so `--help` answers without loading torch and
`vlbert extract` imports nothing of train/.
"""

from __future__ import annotations

from pipelines.own_packages import check_own_packages

check_own_packages()  # before the project's other packages are imported: a user's train.py is not ours

import warnings  # noqa: E402

import click  # noqa: E402

from pipelines.commands import MODULES, load_command  # noqa: E402
from vlbert.utils.errors import error_line, exit_status  # noqa: E402


class VLBertGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(MODULES)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in self.commands and name in MODULES:
            self.add_command(load_command(name))
        return self.commands.get(name)

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


def _show_versions(ctx: click.Context, _option: click.Option, given: bool) -> None:
    if not given or ctx.resilient_parsing:
        return
    from vlbert.utils.versions import version_lines  # torch loads for its CUDA and cuDNN: only when asked

    click.echo("\n".join(version_lines()))
    ctx.exit()


@click.group(cls=VLBertGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, envvar="VLBERT_DEBUG",
              help="Show the full traceback of an error (also: VLBERT_DEBUG=1).")
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_show_versions,
              help="Show the versions of vlbert-pipeline, Python, torch, torchvision, transformers and tokenizers, "
                   "and the CUDA and cuDNN torch was built with, then exit.")
def main(debug: bool) -> None:
    """VL-BERT with offline RoI features: extract, cache, convert, train."""
