"""What a stage does with samples whose FeatureStore record is damaged (`damaged_records`): fail
with one line naming the record, or train and evaluate without them and count them.

Datasets hand such samples over as DamagedSample markers, which travel beside the collated batch
(`train.engine.batches.Batch`); the policy runs in the training process, so its error is never a
DataLoader worker's re-raise and its counts are the stage's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from extract.store.schema import DamagedRecordError, StoreError
from train.data.datasets import DamagedSample

NAMED_RECORDS = 5  # damaged record ids a message lists


@dataclass
class DamagedRecords:
    skip: bool
    skipped: int = 0  # samples left out so far (a damaged record is met again every epoch)
    records: list[str] = field(default_factory=list)  # their distinct image ids, in the order met

    @classmethod
    def from_saved(cls, skip: bool, saved: dict) -> DamagedRecords:
        """With the counts a checkpoint saved (`saved()`; {} for a stage starting afresh)."""
        return cls(skip, saved.get("damaged_skipped", 0), list(saved.get("damaged_ids", [])))

    def saved(self) -> dict:
        return {"damaged_skipped": self.skipped, "damaged_ids": self.records}

    def check(self, damaged: list[DamagedSample], with_images: int) -> None:
        """Applies the policy to a batch's damaged samples (of `with_images` samples that read the
        store): DamagedRecordError for the first unless skipping, StoreError when all of them are
        damaged (too many to train around); otherwise they are counted."""
        if damaged and not self.skip:
            raise DamagedRecordError(f"{_naming_the_record(damaged[0])} (--skip-damaged, or damaged_records: skip, "
                                     "trains without damaged records)", damaged[0].image_id)
        image_ids = list(dict.fromkeys(s.image_id for s in damaged))
        if damaged and len(damaged) == with_images:
            raise StoreError(f"every sample of a batch has a damaged record ({_listed(image_ids)}): the store is too "
                             "damaged to skip around; extract it again")
        self.skipped += len(damaged)
        self.records += [image_id for image_id in image_ids if image_id not in self.records]

    def summary(self) -> str:
        return f"skipped {self.skipped} sample(s) of {len(self.records)} damaged record(s): {_listed(self.records)}"


def _naming_the_record(sample: DamagedSample) -> str:
    return sample.message if sample.image_id in sample.message else f"record {sample.image_id!r}: {sample.message}"


def _listed(image_ids: list[str]) -> str:
    more = len(image_ids) - NAMED_RECORDS
    return ", ".join(image_ids[:NAMED_RECORDS]) + (f" and {more} more" if more > 0 else "")
