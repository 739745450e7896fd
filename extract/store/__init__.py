"""The FeatureStore: the cache of RoI features that the extraction job writes and training reads.

The names below load their module on first use, so that reading the schema's constants (the CLI's
help does) does not open LMDB or NumPy code it does not need."""

import importlib

_MODULES = {
    "extract.store.reader": ("FeatureStore",),
    "extract.store.records": ("decode_record", "encode_record"),
    "extract.store.schema": (
        "SCHEMA_VERSION", "DamagedRecordError", "StoreError", "StoreMismatchError", "build_meta", "dense_class_probs",
        "record_from_regions",
    ),
    "extract.store.writer": ("FeatureStoreWriter",),
}
_EXPORTS = {name: module for module, names in _MODULES.items() for name in names}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'extract.store' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
