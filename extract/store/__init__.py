"""The FeatureStore: the cache of RoI features that the extraction job writes and training reads."""

from extract.store.reader import FeatureStore
from extract.store.records import decode_record, encode_record
from extract.store.schema import (
    SCHEMA_VERSION, DamagedRecordError, StoreError, StoreMismatchError, build_meta, dense_class_probs,
    record_from_regions,
)
from extract.store.writer import FeatureStoreWriter

__all__ = [
    "SCHEMA_VERSION", "DamagedRecordError", "FeatureStore", "FeatureStoreWriter", "StoreError", "StoreMismatchError",
    "build_meta", "decode_record", "dense_class_probs", "encode_record", "record_from_regions",
]
