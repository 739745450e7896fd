"""Errors a user causes: a file, config, path, device or input that cannot be used as given.

Every such error derives from `UserError` and carries the exit status the `vlbert` command ends with:
USAGE when the command could not start as given and nothing was done, FAILED when the job ran and
failed or found problems. The command prints one line (`error_line`) instead of a traceback; any
other exception is a bug and keeps its traceback. This module imports nothing of the project, so
every package may raise its errors without loading torch.
"""

from __future__ import annotations

import errno

USAGE = 2
FAILED = 1


class UserError(ValueError):
    """An error the user can fix; the message names the file, key or item and what is wrong."""

    exit_status = USAGE


class Stopped(UserError):
    """Work stopped by signal `signum` where a rerun resumes it; the exit status says the signal as a
    shell does (128 + its number)."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.signum = signum
        self.exit_status = 128 + signum


def exit_status(exc: BaseException) -> int | None:
    """The status a command ends with for `exc`; None for a bug. A file the system refuses to read
    or write (OSError) counts as a failed job; an error that wraps another (a pipeline's failed step)
    answers for its cause through its own `exit_status`."""
    if isinstance(exc, OSError):
        return FAILED
    return getattr(exc, "exit_status", None)


# The write errors that mean no room was left, as the error line names them.
NO_ROOM = {
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is used up",
    errno.EFBIG: "the file is too large (for the file system, or for the file size limit of the process: ulimit -f)",
}


def error_line(exc: BaseException) -> str:
    """The one line that reports `exc` to the user; a full disk is named as such, with the file."""
    if not isinstance(exc, OSError):
        return str(exc)
    where = f"{exc.filename}: " if exc.filename is not None else ""
    if exc.errno in NO_ROOM:
        return f"{where}{NO_ROOM[exc.errno]} ({exc.strerror})"
    return f"{where}{exc.strerror or exc}" if where else str(exc)
