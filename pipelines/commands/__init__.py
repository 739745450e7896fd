"""One module per subcommand (or group of subcommands), each listing its commands in `COMMANDS`;
`MODULES` names the module of every command, which the CLI imports when the command is asked for.

A command module imports click and light constants only, and what it runs inside its function, so
`vlbert --help` and `vlbert <command> --help` answer without loading torch; and a command imports
no other command's module, so `vlbert extract` imports nothing of train/ (extract/ does not)."""

import functools
import importlib

import click

# Every command by name → its module in this package.
MODULES = {"analyze": "analyze", "cache": "cache", "convert-official": "convert", "data": "data", "demo": "demo",
           "evaluate": "evaluate", "extract": "extract", "pipeline": "pipeline", "train": "train", "vocab": "vocab",
           "world": "world"}


def load_command(name: str) -> click.Command:
    """The command `name` (one of MODULES), its module imported, run under the thread policy."""
    module = importlib.import_module(f"{__name__}.{MODULES[name]}")
    command = next(command for command in module.COMMANDS if command.name == name)
    _with_thread_policy(command)
    return command


def own_threads(callback):
    """Marks a command that sets its threads itself (a pipeline step's process: its spec says how
    many), and that may load no torch at all."""
    callback.own_threads = True
    return callback


def _with_thread_policy(command: click.Command) -> None:
    """Runs the command under vlbert/utils/threads.py's thread policy. It wraps the command's own callback,
    not the group's, which also runs for `vlbert <command> --help` and would import torch for it."""
    if isinstance(command, click.Group):
        for subcommand in command.commands.values():
            _with_thread_policy(subcommand)
        return
    callback = command.callback
    if getattr(callback, "own_threads", False):
        return

    @functools.wraps(callback)
    def run(*args, **kwargs):
        from vlbert.utils.threads import configured_threads

        with configured_threads():
            return callback(*args, **kwargs)

    command.callback = run
