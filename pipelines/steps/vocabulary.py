"""The `vocabulary` step: a demo world's words, a given tokenizer's files, or a WordPiece vocabulary
built from annotation and text files."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipelines.steps.base import Foreknown, Log, StepKind, field_names, missing_paths, parse
from train.engine.errors import RunConfigError
from vlbert.utils.typed_config import EXISTING_PATHS, at_least


@dataclass
class VocabularyParams:
    """One of: `world`, a demo world's words; `given`, a tokenizer folder (a BERT checkpoint's) copied
    as it is; `texts`, annotation .jsonl and plain text files from which a WordPiece vocabulary of at
    most `size` pieces is built (when `given` is null, so that one file serves both)."""

    world: str | None = None
    given: str | None = None
    texts: list[str] = dataclasses.field(default_factory=list, metadata=EXISTING_PATHS)
    size: int = dataclasses.field(default=30522, metadata=at_least(1))
    min_frequency: int = dataclasses.field(default=2, metadata=at_least(1))
    lowercase: bool = True


def _vocabulary_params(params: dict[str, Any]) -> VocabularyParams:
    chosen = parse(VocabularyParams, params)
    if chosen.world is not None and (chosen.given is not None or chosen.texts):
        raise RunConfigError("world: a world's vocabulary is its words; give `world` without `given` and `texts`")
    if chosen.world is None and chosen.given is None and not chosen.texts:
        raise RunConfigError("give `world` (a demo world), `given` (a tokenizer folder) or `texts` "
                             "(annotation or text files to build a WordPiece vocabulary from)")
    return chosen


def vocabulary(params: dict[str, Any], folder: Path, resume: bool, log: Log) -> None:
    """A world's words, a given tokenizer's files, or a WordPiece vocabulary built from `texts`."""
    chosen = _vocabulary_params(params)
    if chosen.world is not None:
        from train.data.vocabulary import write_world_vocabulary

        write_world_vocabulary(chosen.world, folder)
    elif chosen.given is not None:
        from vlbert.tokenization import copy_tokenizer

        copy_tokenizer(chosen.given, folder)
        log(f"vocabulary: {chosen.given}'s tokenizer")
    else:
        from train.data.wordpiece import build_vocabulary

        build_vocabulary([Path(text) for text in chosen.texts], folder, chosen.size, chosen.min_frequency,
                         chosen.lowercase, log)


def _verify_vocabulary(params: dict[str, Any], folder: Path, known: Foreknown) -> list[str]:
    chosen = _vocabulary_params(params)
    problems = missing_paths([("world", chosen.world), ("given", chosen.given),
                              *((f"texts[{i}]", text) for i, text in enumerate(chosen.texts))], known)
    if chosen.given is not None and known.checkable(chosen.given) and not problems:
        if not (Path(chosen.given) / "vocab.txt").is_file():
            problems.append(f"given: {chosen.given} holds no vocab.txt (a tokenizer folder, e.g. a BERT checkpoint's)")
        known.vocabularies[folder] = Path(chosen.given)
    return problems


KIND = StepKind(vocabulary, _vocabulary_params, field_names(VocabularyParams), _verify_vocabulary, light=True)
