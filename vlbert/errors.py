"""Errors a user causes: a file, config, path, device or input that cannot be used as given.

Every such error derives from `UserError` and carries the exit status the `vlbert` command ends with:
USAGE when the command could not start as given and nothing was done, FAILED when the job ran and
failed or found problems. The command prints one line (`error_line`) instead of a traceback; any
other exception is a bug and keeps its traceback. This module imports nothing of the project, so
every package may raise its errors without loading torch.
"""

from __future__ import annotations

USAGE = 2
FAILED = 1


class UserError(ValueError):
    """An error the user can fix; the message names the file, key or item and what is wrong."""

    exit_status = USAGE


def exit_status(exc: BaseException) -> int | None:
    """The status a command ends with for `exc`; None for a bug. A file the system refuses to read
    or write (OSError) counts as a failed job; an error that wraps another (a pipeline's failed step)
    answers for its cause through its own `exit_status`."""
    if isinstance(exc, OSError):
        return FAILED
    return getattr(exc, "exit_status", None)


def error_line(exc: BaseException) -> str:
    """The one line that reports `exc` to the user."""
    if isinstance(exc, OSError) and exc.filename is not None:
        return f"{exc.filename}: {exc.strerror or exc}"
    return str(exc)
