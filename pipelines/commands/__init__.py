"""One module per subcommand (or group of subcommands); `register` adds them all to the CLI.

A command module imports click and light constants only, and what it runs inside its function, so
`vlbert --help` and `vlbert <command> --help` answer without loading torch."""

import functools

import click


def register(group: click.Group) -> None:
    from pipelines.commands import analyze, cache, convert, data, demo, evaluate, extract, pipeline, train, vocab, world

    for module in (data, extract, cache, train, evaluate, convert, world, pipeline, demo, analyze, vocab):
        for command in module.COMMANDS:
            _with_thread_policy(command)
            group.add_command(command)


def _with_thread_policy(command: click.Command) -> None:
    """Runs the command under extract/threads.py's thread policy. It wraps the command's own callback,
    not the group's, which also runs for `vlbert <command> --help` and would import torch for it."""
    if isinstance(command, click.Group):
        for subcommand in command.commands.values():
            _with_thread_policy(subcommand)
        return
    callback = command.callback

    @functools.wraps(callback)
    def run(*args, **kwargs):
        from extract.threads import configured_threads

        with configured_threads():
            return callback(*args, **kwargs)

    command.callback = run
