"""The `analyze` step: an analysis of a saved model, as `vlbert analyze ANALYSIS` runs it
(train/analysis/), its outputs in the step's folder: `grounding` (grounding.json, grounding.png),
`syntax` (syntax.json, syntax.md, relations.png, layers/) or `words` (words.json, words.md)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal

from pipelines.steps.base import (Foreknown, Layout, Log, StepKind, device_problems, missing_paths, parse, registered,
                                  takes_gpu)
from train.analysis.parses import PARSERS
from train.analysis.grounding_results import held_out_of
from train.analysis.phrases import MIN_LENGTH, PHRASE_READERS
from train.analysis.relations import LABEL_SETS
from train.analysis.syntax_results import held_out_by_relation
from train.analysis.verdicts import grounding_verdicts, syntax_verdicts, words_verdicts
from train.analysis.word_groups import check_groups
from train.analysis.word_results import WordsResult
from train.data.files import DataError, read_json
from train.engine.errors import RunConfigError
from vlbert.utils.paths import resolves_inside
from vlbert.utils.typed_config import at_least

# The choices of `vlbert analyze`'s options, from the registries it offers.
PhraseFormat = Literal[tuple(PHRASE_READERS)]
Parser = Literal[tuple(PARSERS)]
Labels = Literal[tuple(LABEL_SETS)]


@dataclass
class AnalysisParams:
    """What every analysis takes: the model, its inputs, how it runs (the `vlbert analyze` options)."""

    analysis: str
    model: str  # a saved model folder, e.g. `${STEP.final}` of a train step
    store: str
    annotations: str
    vocabulary: str
    max_items: int | None = dataclasses.field(default=None, metadata=at_least(1))
    batch_size: int = dataclasses.field(default=16, metadata=at_least(1))
    max_length: int | None = dataclasses.field(default=None, metadata=at_least(MIN_LENGTH))
    device: str = "cpu"
    fresh_weights: bool = False  # the model's config freshly initialised: the before-training reference


@dataclass
class GroundingParams(AnalysisParams):
    format: PhraseFormat = "refs"
    images: str | None = None  # the images root, to draw `examples` on the images
    examples: int = dataclasses.field(default=0, metadata=at_least(0))


@dataclass
class SyntaxParams(AnalysisParams):
    parses: str | None = None  # CoNLL-U, one sentence per caption (parser conllu)
    parser: Parser = "conllu"
    labels: Labels | None = None  # default: the parser's (conllu ud, spacy clearnlp)
    plot: list[str] = dataclasses.field(default_factory=list)  # relations to draw as Figure 4
    min_region_attention: float | None = dataclasses.field(default=None, metadata=at_least(0.0))  # below 1

    def __post_init__(self) -> None:
        if self.min_region_attention is not None and self.min_region_attention >= 1:
            raise RunConfigError(f"min_region_attention: expected a share below 1 (the paper: 0.2), "
                                 f"found {self.min_region_attention!r}")


@dataclass
class WordsParams(AnalysisParams):
    groups: dict = dataclasses.field(default_factory=dict)  # name → words reported together

    def __post_init__(self) -> None:
        try:
            self.groups = check_groups(self.groups)
        except DataError as exc:
            raise RunConfigError(f"groups: {exc}") from None


def _grounding(chosen: GroundingParams, folder: Path) -> str:
    from train.analysis.grounding import analyze_grounding

    result = analyze_grounding(chosen.model, chosen.store, chosen.annotations, chosen.vocabulary, folder,
                               chosen.format, images=chosen.images, examples=chosen.examples,
                               max_items=chosen.max_items, **_running(chosen))
    figures = result.scores.figures
    best = figures.best
    return (f"{result.scores.count} phrases: best head layer {best.layer} head {best.head} "
            f"{best.accuracy:.3f}, random RoI {figures.random_baseline:.3f}, most confident RoI "
            f"{figures.confidence_baseline:.3f}, {len(result.left_out)} left out (their box no box)"
            + "".join(f"; {line}" for line in grounding_verdicts(figures.held_out_best)))


def _syntax(chosen: SyntaxParams, folder: Path) -> str:
    from train.analysis.syntax import analyze_syntax

    result = analyze_syntax(chosen.model, chosen.store, chosen.annotations, chosen.vocabulary, folder,
                            parses=chosen.parses, parser=chosen.parser, plot=chosen.plot or None,
                            min_region_attention=chosen.min_region_attention, max_items=chosen.max_items,
                            labels=chosen.labels, **_running(chosen))
    verdicts = syntax_verdicts(result.held_out())
    return (f"{result.arcs} arcs of {len(result.relations)} relations in {result.captions} captions, "
            f"{len(result.skipped)} skipped" + "".join(f"; {line}" for line in verdicts[:2]))


def _words(chosen: WordsParams, folder: Path) -> str:
    from train.analysis.masked_words import analyze_masked_words

    result = analyze_masked_words(chosen.model, chosen.store, chosen.annotations, chosen.vocabulary, folder,
                                  chosen.groups, max_items=chosen.max_items, **_running(chosen))
    return "; ".join([f"{result.figures.masked_words} masked words in {result.captions} captions",
                      *words_verdicts(result)])


def _running(chosen: AnalysisParams) -> dict[str, Any]:
    return dict(batch_size=chosen.batch_size, device=chosen.device, max_length=chosen.max_length,
                fresh_weights=chosen.fresh_weights)


@dataclass(frozen=True)
class Analysis:
    params: type  # an AnalysisParams dataclass
    run: Callable[[Any, Path], str]  # (params, folder) → a line for the log; writes its outputs in folder
    paths: tuple[str, ...]  # its fields that name input files and folders, beyond the common ones
    result: str  # the file of its folder holding its result (JSON)
    verdicts: Callable[[Any], list[str]]  # that result → its verdicts in words, for the report
    read: Callable[[dict[str, Any]], Any]  # the JSON → what the verdicts take (the report reads the file)


ANALYSES = {
    "grounding": Analysis(GroundingParams, _grounding, ("images",), "grounding.json", grounding_verdicts, held_out_of),
    "syntax": Analysis(SyntaxParams, _syntax, ("parses",), "syntax.json", syntax_verdicts, held_out_by_relation),
    "words": Analysis(WordsParams, _words, (), "words.json", words_verdicts, WordsResult.from_json),
}


def analysis_verdicts(folder: Path) -> list[str]:
    """The verdicts in words of the analysis whose result `folder` holds (none where it holds none);
    DataError naming the file where it is not a JSON object, or a symlink out of `folder`."""
    lines = []
    for analysis in ANALYSES.values():
        path = folder / analysis.result
        if path.is_file():
            if not resolves_inside(path, folder):
                raise DataError(f"{path}: a symlink to {path.resolve()}, outside its step's folder: not read")
            result = read_json(path)
            if not isinstance(result, dict):
                raise DataError(f"{path}: expected the analysis's JSON object, found {type(result).__name__}")
            lines += analysis.verdicts(analysis.read(result))
    return lines


_COMMON_PATHS = ("model", "store", "annotations", "vocabulary")


def analysis_params(params: dict[str, Any]) -> AnalysisParams:
    """The step's parameters for its `analysis`, checked (names, types, ranges, choices)."""
    return parse(ANALYSES[registered(params, "analysis", ANALYSES)].params, params)


def _analysis_fields(params: dict[str, Any]) -> list[str]:
    analysis = ANALYSES.get(params["analysis"]) if isinstance(params.get("analysis"), str) else None
    return [spec.name for spec in dataclasses.fields(analysis.params if analysis else AnalysisParams)]


def _input_paths(chosen: AnalysisParams) -> list[tuple[str, str | None]]:
    return [(name, getattr(chosen, name)) for name in _COMMON_PATHS + ANALYSES[chosen.analysis].paths]


def analyze(params: dict[str, Any], folder: Path, resume: bool, log: Log) -> None:
    """The analysis, its outputs in the step's folder (an interrupted one starts again)."""
    from vlbert.utils.paths import output_folder

    chosen = analysis_params(params)
    output_folder(folder, _input_paths(chosen), "the step's folder")  # it holds no input it would write over
    log(f"{chosen.analysis}: {ANALYSES[chosen.analysis].run(chosen, folder)}; {folder}")


def _verify_analyze(params: dict[str, Any], folder: Path, known: Foreknown) -> list[str]:
    chosen = analysis_params(params)
    return missing_paths(_input_paths(chosen), known) + device_problems(chosen.device, [], known)


def _analyze_layout(params: dict[str, Any]) -> Layout:
    return Layout(gpu=takes_gpu(params.get("device", "cpu")))


KIND = StepKind(analyze, analysis_params, _analysis_fields, _verify_analyze, layout=_analyze_layout)
