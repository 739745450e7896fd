"""Paths from others, kept where they belong: every command's outputs apart from its inputs, and
every path built from a name in a file (a record's id, an image path in a list) inside its folder.

`check_apart` refuses an output that is, lies inside, or holds one of the command's inputs, before
anything is written: writing it could replace an input, and a later run could read the output as
one of its inputs. Paths are compared resolved (symlinks, `..`).

`path_inside` refuses a name that could leave its folder: empty, absolute, holding a NUL byte or a
`..` component. A record id is refused as well when it has an empty or `.` component (`a//b`,
`a/./b`): it would be the file of another id, which an export would overwrite.

`output_folder` checks a command's output folder apart from its inputs and declares it for the rest
of the process; `checked`, which the project's writers call on every path they write
(vlbert/utils/atomic.py), then refuses a path below a declared output folder that resolves outside it: a
symlink there (left by a careless or hostile hand) would take the write elsewhere. Symlinks that stay
inside the folder are followed; the output folder itself is resolved once, when it is declared, so
one given as a symlink is the user's choice.
"""

from __future__ import annotations

import os
import posixpath
from pathlib import Path
from typing import Iterable, NamedTuple

from vlbert.utils.errors import UserError


class OutputOverlapError(UserError):
    """An output that is, lies inside or holds one of the command's inputs."""


class OutsidePathError(UserError):
    """A name from a file that would make a path outside its folder."""


class EscapingPathError(UserError):
    """A path to write below an output folder that a symlink takes outside it."""


class _Output(NamedTuple):
    given: str  # absolute, as given (symlinks kept)
    real: Path  # resolved when declared


# The output folders this process writes, by absolute path, the latest declared last: a folder declared
# again (each command that a long-lived process runs declares its own) is one entry, the latest.
_DECLARED: dict[str, _Output] = {}


def check_apart(out: str | Path, inputs: Iterable[tuple[str, str | Path | None]], out_name: str = "--out") -> None:
    """OutputOverlapError, in one line, when `out` is, lies inside or holds one of `inputs` ((the
    option naming it, its path); None: not given). The input nearest to `out` is named."""
    target = _resolved(out)
    clashes = []
    for option, path in inputs:
        if path is None:
            continue
        source = _resolved(path)
        if target == source or source in target.parents or target in source.parents:
            clashes.append((option, path, source))
    if not clashes:
        return
    option, path, source = min(clashes, key=lambda clash: abs(len(clash[2].parts) - len(target.parts)))
    relation = "is" if target == source else "lies inside" if source in target.parents else "holds"
    raise OutputOverlapError(f"{out_name} {out}: {relation} the input {option} {path}; an output is never written "
                             f"over an input (nor where a later run would read it as one): choose another {out_name}")


def output_folder(out: str | Path, inputs: Iterable[tuple[str, str | Path | None]] = (),
                  out_name: str = "--out") -> Path:
    """`out`, checked apart from `inputs` (`check_apart`) and declared an output folder of this process:
    from now on `checked` keeps every write below it inside it. One declared inside an output folder
    declared before must resolve inside that one."""
    check_apart(out, inputs, out_name)
    checked(out)
    given = os.path.abspath(out)
    _DECLARED.pop(given, None)
    _DECLARED[given] = _Output(given, _resolved(out))
    return Path(out)


def checked(path: str | Path) -> Path:
    """`path`, which this process is about to write (a file, a folder to make or fill); EscapingPathError,
    in one line naming the symlink, where it lies below a declared output folder and resolves outside
    it. A path below none is returned as it is."""
    absolute = os.path.abspath(path)
    enclosing = [(index, output) for index, output in enumerate(_DECLARED.values())
                 if _below(absolute, output.given) or _below(absolute, str(output.real))]
    if not enclosing:
        return Path(path)
    # The innermost folder (the latest of equal ones) decides: it was checked inside those around it.
    _, output = max(enclosing, key=lambda item: (len(item[1].given), item[0]))
    if not _inside(_resolved(path), output.real):
        raise EscapingPathError(f"{_escape(absolute, output)}, outside the output folder {output.given}: nothing is "
                                "written through a symlink that leaves its output folder (remove the link, or "
                                "choose another output folder)")
    return Path(path)


def resolves_inside(path: str | Path, root: str | Path) -> bool:
    """Whether `path`, its symlinks followed, lies inside `root` (a symlink loop lies nowhere): what a
    command reads of a folder that others may have written, it reads from that folder only."""
    return Path(os.path.realpath(path)).is_relative_to(os.path.realpath(root))


def _below(absolute: str, folder: str) -> bool:
    return absolute == folder or absolute.startswith(folder.rstrip(os.sep) + os.sep)


def _inside(resolved: Path, root: Path) -> bool:
    return resolved == root or root in resolved.parents


def _escape(absolute: str, output: _Output) -> str:
    """Which symlink below the output folder takes `absolute` outside it, and where to."""
    start = output.given if _below(absolute, output.given) else str(output.real)
    current = Path(start)
    for part in Path(os.path.relpath(absolute, start)).parts:
        current = current / part
        if current.is_symlink() and not _inside(_resolved(current), output.real):
            return f"{current} is a symlink to {_resolved(current)}"
    return f"{absolute} resolves to {_resolved(absolute)}"


def _resolved(path: str | Path) -> Path:
    try:
        return Path(path).resolve()
    except (OSError, RuntimeError) as exc:  # a symlink loop (RuntimeError before Python 3.13)
        raise OutputOverlapError(f"{path}: cannot be resolved ({exc}), so it cannot be told apart from the "
                                 "command's other paths") from None


def outside_reason(name: str, record_id: bool = True) -> str | None:
    """Why the relative path `name` could name something outside its folder (or, for a `record_id`,
    the file of another id); None when it cannot."""
    if not name:
        return "is empty"
    if "\0" in name:
        return "holds a NUL byte"
    if name.startswith("/"):
        return "is an absolute path"
    parts = name.split("/")
    if ".." in parts:
        return "has a '..' component"
    if record_id and any(part in ("", ".") for part in parts):
        return "has an empty or '.' component"
    if not record_id and posixpath.normpath(name) == ".":
        return "names the folder itself"
    return None


def path_inside(root: str | Path, name: str, what: str = "record id", record_id: bool = True) -> Path:
    """`root / name` (for a name that is not a `record_id`, without its `.` and empty components);
    OutsidePathError, naming `what` and the name, when it could leave `root`."""
    reason = outside_reason(name, record_id)
    if reason is not None:
        raise OutsidePathError(f"{what} {name!r} {reason}: it would make a path outside {root}")
    return Path(root) / (name if record_id else posixpath.normpath(name))
