"""Groups of words that `vlbert analyze words` reports together (e.g. the colour words), checked
where they are given: on the command line, in an `analyze` step (without loading torch)."""

from __future__ import annotations

from typing import Any

from train.data.files import DataError


def check_groups(groups: dict[str, Any]) -> dict[str, list[str]]:
    """The groups with their words lower-cased; DataError naming a group that is not a list of words,
    names none, or has a member that is not one word."""
    checked = {}
    for name, members in groups.items():
        if not isinstance(members, list) or not all(isinstance(member, str) for member in members):
            raise DataError(f"group {name!r}: expected a list of words, found {members!r}")
        lowered = [member.strip().lower() for member in members]
        if not lowered:
            raise DataError(f"group {name!r}: names no words")
        for member in lowered:
            if not member or member.split() != [member]:
                raise DataError(f"group {name!r}: {member!r} is not one word")
        checked[str(name)] = lowered
    return checked
