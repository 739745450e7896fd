"""The base class of the errors users cause, and the exit status each ends a command with.

A user error is one line naming the file, key or item at fault and what is wrong. The `vlbert`
command prints that line and exits with the error's `exit_status`; anything else is a bug and keeps
its traceback. Standard library only, so that any package may import it without importing torch.
"""

from __future__ import annotations

USAGE = 2  # the command could not start as given; nothing was done
FAILED = 1  # the job ran and failed, or found problems


class UserError(ValueError):
    """An error the user can fix from its message; subclasses set the exit status it ends a command with."""

    exit_status: int = USAGE


def exit_status(exc: BaseException) -> int | None:
    """The exit status a command ends with for `exc`: its own `exit_status` (user errors, and errors that
    carry one, such as a failed pipeline step), 1 for an OSError; None for a bug."""
    status = getattr(exc, "exit_status", None)
    if status is None and isinstance(exc, OSError):
        return FAILED
    return status


def error_line(exc: BaseException) -> str:
    """`exc` in one line; an OSError names its file."""
    if isinstance(exc, OSError) and exc.filename is not None:
        return f"{exc.filename}: {exc.strerror or exc}"
    return str(exc)
