"""Tar shards written member by member, for the tests of reading them."""

import io
import os
import tarfile


def write_tar(path, members, end=True):
    """A tar of `members` ((name, bytes), or (name, (tarfile type,)) for a member that is no file), in order.
    Without `end`, the end-of-archive blocks are cut off, as a killed writer leaves it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as archive:
        for name, data in members:
            info = tarfile.TarInfo(name)
            if isinstance(data, bytes):
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
            else:
                (info.type,), info.linkname = data, "elsewhere"
                archive.addfile(info)
        length = archive.offset
    if not end:
        os.truncate(path, length)
    return path
