"""Tar shards as an image source: img2dataset's `--output_format webdataset` output, read in place.

A shard is an uncompressed `.tar` of samples: per sample consecutive members `KEY.jpg` (or another
image extension), `KEY.txt`, `KEY.json`, ... sharing KEY (webdataset's rule: the member's name up to
the first dot of its base name). A shard is read as the folder of its name, so that ids agree with
img2dataset's `files` output: with images root R, member `KEY.jpg` of `R/a/00000.tar` has the id
`a/00000/KEY`, the id `extract.images.image_id` gives the file `R/a/00000/KEY.jpg`.

Read with the standard library's `tarfile` rather than the `webdataset` package: no dependency, and
damage is handled here, as a batch job needs it (a damaged member is named and skipped, a truncated
shard is read up to its damage) instead of raising from inside someone else's iterator. A shard is
read in one forward pass over a seekable file, header after header, never listing the archive first;
the data of members not asked for is skipped by seeking, so listing ids reads only the headers.
(tarfile's 'r|' stream mode would read skipped data to skip it.)
"""

from __future__ import annotations

import glob
import itertools
import os
import re
import tarfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable, Collection, Iterable, Iterator

from extract.images import IMAGE_EXTENSIONS
from vlbert.utils.errors import UserError
from vlbert.utils.paths import outside_reason

SHARD_SUFFIX = ".tar"
# Extensions (lower case, without the dot) that make a member a sample's image.
IMAGE_MEMBER_EXTENSIONS = frozenset(extension[1:] for extension in IMAGE_EXTENSIONS)
PATTERN_CHARACTERS = "*?[{"
_BRACE = re.compile(r"\{([^{}]*)\}")
_RANGE = re.compile(r"(-?\d+)\.\.(-?\d+)")
MAX_PATTERN_NAMES = 1_000_000  # more shards than any corpus's img2dataset output: a pattern naming more is a slip


class ShardError(UserError):
    """`images` names no tar shard that can be read."""


@dataclass
class ShardSample:
    id: str  # the image id: the shard's path under the root without `.tar`, then the sample's KEY
    members: dict[str, bytes]  # extension (lower case, no dot) → data, for the extensions asked for
    shard: Path
    extensions: tuple[str, ...] = ()  # every member's extension, from the headers (read or not)
    unreadable: tuple[str, ...] = ()  # members whose data could not be read (named to on_damage too)

    @property
    def image_extension(self) -> str | None:
        """The extension of the sample's image member (the first, if several); None without one."""
        return next((extension for extension in self.extensions if extension in IMAGE_MEMBER_EXTENSIONS), None)


def _warn(message: str) -> None:
    warnings.warn(message, stacklevel=3)


def names_shards(images: str | Path) -> bool:
    """Whether `images` names tar shards rather than image files: a `.tar` file, a pattern ending in
    `.tar`, or a folder that holds `.tar` files and no image files."""
    text = str(images)
    if text.endswith(SHARD_SUFFIX):
        return True
    path = Path(images)
    if any(character in text for character in PATTERN_CHARACTERS) and not path.exists():
        return False
    if not path.is_dir():
        return False
    found_tar = False
    for _, _, files in os.walk(path):
        for name in files:
            suffix = os.path.splitext(name)[1].lower()
            if suffix in IMAGE_EXTENSIONS:
                return False  # stops at the first image: a folder of millions of files is not walked
            found_tar = found_tar or suffix == SHARD_SUFFIX
    return found_tar


def find_shards(images: str | Path) -> tuple[Path, list[Path]]:
    """(the images root, the sorted shard paths) that `images` names: a `.tar` file, a folder (its
    `.tar` files, recursively), a glob (`R/*.tar`) or a brace range (`R/{00000..00331}.tar`, also
    `{a,b}` lists). For a pattern the root is its folder part before the first pattern character;
    every name a brace range spells out must exist (a missing shard is not left out unnoticed), and it
    may spell out at most MAX_PATTERN_NAMES (names are spelt out one at a time, so a larger range is
    refused without building its list)."""
    text = str(images)
    first = min((text.index(c) for c in PATTERN_CHARACTERS if c in text), default=None)
    if first is not None and not Path(text).exists():
        root = Path(os.path.dirname(text[:first]) or ".")
        shards, missing = set(), []
        names = list(itertools.islice(expand_braces(text), MAX_PATTERN_NAMES + 1))
        if len(names) > MAX_PATTERN_NAMES:
            raise ShardError(f"images {text}: names more than {MAX_PATTERN_NAMES:,} shards; a shard pattern may "
                             f"name at most {MAX_PATTERN_NAMES:,}")
        for name in names:
            if any(character in name for character in "*?["):
                shards.update(Path(match) for match in glob.glob(name))
            elif os.path.exists(name):
                shards.add(Path(name))
            else:
                missing.append(name)
        if missing:
            raise ShardError(f"images {text}: {len(missing)} of the shards it names do not exist (e.g. {missing[0]})")
    elif Path(text).is_dir():
        root = Path(text)
        shards = {path for path in root.rglob(f"*{SHARD_SUFFIX}")}
    else:
        root, shards = Path(text).parent, {Path(text)}
        if not Path(text).is_file() or not text.endswith(SHARD_SUFFIX):
            raise ShardError(f"images {text}: not a {SHARD_SUFFIX} file, a folder of them or a pattern naming them")
    found = sorted(path for path in shards if path.name.endswith(SHARD_SUFFIX) and path.is_file())
    if not found:
        raise ShardError(f"images {text}: names no {SHARD_SUFFIX} shard")
    return root, found


def expand_braces(pattern: str) -> Iterator[str]:
    """The names a brace pattern spells out, one at a time, in order: `{00000..00002}` (zero-padded to
    the width of the first bound when it has leading zeros), `{a,b}`; several braces multiply."""
    match = _BRACE.search(pattern)
    if match is None:
        yield pattern
        return
    head, tail, body = pattern[:match.start()], pattern[match.end():], match.group(1)
    numbers = _RANGE.fullmatch(body)
    if numbers:
        low, high = numbers.group(1), numbers.group(2)
        width = len(low) if low.startswith("0") and len(low) > 1 else 0
        step = 1 if int(high) >= int(low) else -1
        choices: Iterable[str] = (str(n).zfill(width) for n in range(int(low), int(high) + step, step))
    else:
        choices = body.split(",")
    for choice in choices:
        yield from expand_braces(head + choice + tail)


def shard_id(shard: Path, root: Path) -> str:
    """The id prefix of a shard's samples: its path under `root` without `.tar`, as a folder's."""
    relative = Path(shard).relative_to(root).as_posix()
    return relative[: -len(SHARD_SUFFIX)]


def split_member_name(name: str) -> tuple[str, str] | None:
    """(KEY, extension in lower case) of a member name, webdataset's way: the name up to the first
    dot of its base name, and the rest; None for a name without a dot in its base name."""
    folder, _, base = name.rpartition("/")
    stem, dot, extension = base.partition(".")
    if not dot or not stem:
        return None
    return (f"{folder}/{stem}" if folder else stem), extension.lower()


def read_shard(shard: Path, root: Path, extensions: Collection[str] | None = None,
               on_damage: Callable[[str], None] = _warn) -> Iterator[ShardSample]:
    """The samples of `shard` in order, read in one forward pass; the data of members whose extension
    is in `extensions` (None: every member) is read, the others' skipped by seeking.

    Damage never raises; it is named (shard and member) to `on_damage`: a truncated shard or an
    unreadable header ends the iteration after the last whole sample; a member whose data cannot be
    read is left out of its sample (listed in `unreadable`); a member that is not a regular file, a
    name that could leave the shard's folder or has no extension, and a KEY met again after other
    samples are skipped. A sample without an image member is still yielded: callers decide."""
    shard, prefix = Path(shard), shard_id(shard, root)
    wanted = None if extensions is None else {extension.lower() for extension in extensions}
    try:
        handle = open(shard, "rb")
    except OSError as exc:
        on_damage(f"{shard}: cannot be opened ({exc.strerror or exc}); none of its samples were read")
        return
    with handle:
        yield from _samples(handle, shard, prefix, wanted, on_damage)


def _samples(handle: BinaryIO, shard: Path, prefix: str, wanted: set[str] | None,
             on_damage: Callable[[str], None]) -> Iterator[ShardSample]:
    size = os.fstat(handle.fileno()).st_size
    try:
        archive = tarfile.open(fileobj=handle, mode="r:")
    except tarfile.TarError as exc:
        on_damage(f"{shard}: not a readable tar file ({exc}); none of its samples were read")
        return
    current: ShardSample | None = None
    done: set[str] = set()
    position = 0  # where the next header starts, for the end-of-archive check
    while True:
        try:
            member = archive.next()
        except (tarfile.TarError, OSError) as exc:
            on_damage(f"{shard}: unreadable tar header at byte {position} ({exc}); the rest of the shard is lost")
            return
        if member is None:
            break
        position = member.offset_data + _padded(member.size)
        parts = split_member_name(member.name)
        # The headers of a truncated tar read well up to its end; its data does not (tarfile ends
        # the iteration silently there, or at a header it cannot read).
        if member.offset_data + member.size > size:
            on_damage(f"{shard}: truncated in member {member.name} ({size - member.offset_data} of {member.size} "
                      f"bytes); the shard is read up to it")
            if current is not None and (parts is None or current.id != f"{prefix}/{parts[0]}"):
                yield current  # whole: the truncated member starts another sample
            return
        if member.isdir():
            continue
        reason = (f"is not a regular file (tar type {member.type!r})" if not member.isfile()
                  else "has no extension, so belongs to no sample" if parts is None
                  else f"would make the id {prefix}/{parts[0]!r}, which {outside_reason(parts[0])}"
                  if outside_reason(parts[0]) else None)
        if reason:
            on_damage(f"{shard}: member {member.name} {reason}; skipped")
            continue
        key, extension = parts
        if current is None or current.id != f"{prefix}/{key}":
            if current is not None:
                yield current
                done.add(current.id)
            current = ShardSample(f"{prefix}/{key}", {}, shard)
            if current.id in done:
                on_damage(f"{shard}: member {member.name} belongs to sample {key}, met again after other samples "
                          "(a sample's members must be consecutive); skipped")
                current = None
                continue
        if extension in current.extensions:
            on_damage(f"{shard}: member {member.name} repeats extension {extension} in sample {key}; skipped")
            continue
        current.extensions += (extension,)
        if wanted is None or extension in wanted:
            try:
                current.members[extension] = archive.extractfile(member).read()
            except (tarfile.TarError, OSError) as exc:
                on_damage(f"{shard}: member {member.name} cannot be read ({exc}); skipped")
                current.unreadable += (member.name,)
    if position + tarfile.BLOCKSIZE > size:
        # No end-of-archive block after the last member: the writer stopped there, and a member
        # could be missing from the last sample.
        on_damage(f"{shard}: ends without tar's end-of-archive block (truncated after byte {size}); the last "
                  f"sample{'' if current is None else f' ({current.id})'} is left out")
        return
    handle.seek(position)
    if handle.read(tarfile.BLOCKSIZE) != tarfile.NUL * tarfile.BLOCKSIZE:
        on_damage(f"{shard}: unreadable tar header at byte {position}; the rest of the shard is lost")
        return
    if current is not None:
        yield current


def _padded(size: int) -> int:
    return -(-size // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE


def image_ids(shard: Path, root: Path, on_damage: Callable[[str], None] = _warn) -> Iterator[str]:
    """The ids of the samples of `shard` that hold an image member, from its tar headers only."""
    for sample in read_shard(shard, root, (), on_damage):
        if sample.image_extension is not None:
            yield sample.id
