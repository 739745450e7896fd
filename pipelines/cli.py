"""The `vlbert` command: a click group whose subcommands are thin layers over the Python API."""

import click

from pipelines.commands import register


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """VL-BERT with offline RoI features: extract, cache, convert, train."""


register(main)
