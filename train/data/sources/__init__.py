"""Readers of the benchmarks' published files, one module per source; each fills a Preparation
(train/data/prepare.py) with annotations in the project's one schema. `SOURCES` (name → Source)
lists them all."""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    # Built on first use, so that importing one reader does not import every other.
    if name == "SOURCES":
        from train.data.sources import captions, img2dataset, karpathy, nlvr2, refer, sbu, snli_ve, vcr, vqa2

        return {source.name: source for source in (vqa2.SOURCE, vcr.SOURCE, *refer.SOURCES, *captions.SOURCES,
                                                   *karpathy.SOURCES, snli_ve.SOURCE, nlvr2.SOURCE, sbu.SOURCE,
                                                   img2dataset.SOURCE)}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
