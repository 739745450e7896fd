"""One module per subcommand (or group of subcommands); `register` adds them all to the CLI."""

import click


def register(group: click.Group) -> None:
    from pipelines.commands import analyze, cache, convert, data, demo, evaluate, extract, pipeline, train, vocab, world

    for module in (data, extract, cache, train, evaluate, convert, world, pipeline, demo, analyze, vocab):
        for command in module.COMMANDS:
            group.add_command(command)
