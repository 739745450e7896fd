"""Damages a copy of a FeatureStore's data file in each of several ways and runs the cache commands'
Python API on it, in a process of its own: a damaged file must give errors, never a signal.

    python -m tests.helpers.store_damage CLEAN_STORE WORK_DIR MUTATIONS.json

MUTATIONS.json: a list of ["truncate", size, 0] or ["xor", offset, mask]. Prints one JSON line per
mutation: {"index", "detected", "same", "messages"}; `same` (only when nothing was detected) says
whether every record still reads exactly as in the clean store.
"""

import hashlib
import json
import shutil
import sys
from pathlib import Path

import numpy as np

from extract.store import FeatureStore, StoreError
from extract.store.audit import store_info, verify_store
from extract.store.interop import export_store

SHARD_FILE = Path("shards") / "shard-00000-of-00001" / "data.mdb"


def digest(root: Path) -> str:
    """Every record's id, field names and bytes."""
    h = hashlib.sha256()
    with FeatureStore(root) as store:
        for image_id in store:
            h.update(image_id.encode())
            for name, value in sorted(store[image_id].items()):
                h.update(name.encode() + (value.tobytes() if isinstance(value, np.ndarray) else repr(value).encode()))
    return h.hexdigest()


def damaged_copy(clean: Path, root: Path, kind: str, where: int, mask: int) -> None:
    shutil.copytree(clean, root)
    data = bytearray((clean / SHARD_FILE).read_bytes())
    if kind == "truncate":
        del data[where:]
    else:
        data[where] ^= mask
    (root / SHARD_FILE).write_bytes(bytes(data))


def run(root: Path, exported: Path) -> tuple[bool, list[str]]:
    """(whether the damage was reported, every error message)."""
    messages = []
    verification = verify_store(root)
    messages += verification.problems
    for command in (lambda: store_info(root), lambda: export_store(root, "npz", exported)):
        try:
            command()
        except StoreError as exc:
            messages.append(str(exc))
    return bool(verification.problems), messages


def main() -> None:
    clean, work, mutations = Path(sys.argv[1]), Path(sys.argv[2]), json.loads(Path(sys.argv[3]).read_text())
    reference = digest(clean)
    for index, (kind, where, mask) in enumerate(mutations):
        root = work / f"store-{index}"  # a new path each time: no cached file check applies
        damaged_copy(clean, root, kind, where, mask)
        detected, messages = run(root, work / f"export-{index}")
        same = None if detected else digest(root) == reference
        print(json.dumps({"index": index, "detected": detected, "same": same, "messages": messages}), flush=True)
        shutil.rmtree(root)
        shutil.rmtree(work / f"export-{index}", ignore_errors=True)


if __name__ == "__main__":
    main()
