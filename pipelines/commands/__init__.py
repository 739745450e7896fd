"""One module per subcommand (or group of subcommands); `register` adds them all to the CLI."""

import click


def register(group: click.Group) -> None:
    from pipelines.commands import convert, extract

    for module in (extract, convert):
        for command in module.COMMANDS:
            group.add_command(command)
