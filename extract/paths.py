"""Paths from others, kept where they belong: every command's outputs apart from its inputs, and
every path built from a name in a file (a record's id, an image path in a list) inside its folder.

`check_apart` refuses an output that is, lies inside, or holds one of the command's inputs, before
anything is written: writing it could replace an input, and a later run could read the output as
one of its inputs. Paths are compared resolved (symlinks, `..`).

`path_inside` refuses a name that could leave its folder: empty, absolute, holding a NUL byte or a
`..` component. A record id is refused as well when it has an empty or `.` component (`a//b`,
`a/./b`): it would be the file of another id, which an export would overwrite.
"""

from __future__ import annotations

import posixpath
from pathlib import Path
from typing import Iterable

from vlbert.errors import UserError


class OutputOverlapError(UserError):
    """An output that is, lies inside or holds one of the command's inputs."""


class OutsidePathError(UserError):
    """A name from a file that would make a path outside its folder."""


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
