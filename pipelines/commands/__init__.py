"""The `vlbert` subcommands: one module per subcommand (or group of subcommands), imported when the
subcommand runs or shows its help, so that `vlbert --help` imports none of them (nor torch)."""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import click


@dataclass(frozen=True)
class Entry:
    module: str  # the module of pipelines.commands whose COMMANDS hold it
    summary: str  # its line in `vlbert --help`: the first sentence of its help (a test keeps them equal)


COMMANDS: dict[str, Entry] = {
    "data": Entry("data", "Prepare published datasets for extraction and training."),
    "extract": Entry("extract", "Extract RoI features for every image under --images into the FeatureStore --out."),
    "cache": Entry("cache", "Inspect, verify and convert FeatureStores."),
    "train": Entry("train", "Train the stages of CONFIG (RunConfig fields in YAML); under torchrun, with DDP."),
    "evaluate": Entry("evaluate", "Score predictions with the benchmarks' official metrics (percentages, 2 decimals)."),
    "convert-official": Entry("convert", "Convert an official VL-BERT checkpoint SOURCE (e.g. vl-bert-base-e2e.model)."),
    "world": Entry("world", "The demo world: synthetic shape scenes with captions, VQA, referring expressions, a corpus."),
    "pipeline": Entry("pipeline", "Run pipeline files (YAML): world or data → extract → pre-train → fine-tune → report."),
    "demo": Entry("demo", "Run the demo pipeline on the embedded world and print where its report went."),
    "analyze": Entry("analyze", "Analyses of a trained model's attention."),
    "vocab": Entry("vocab", "WordPiece vocabularies from your own texts, for training without a BERT checkpoint."),
}


def load_command(name: str) -> click.Command:
    module = importlib.import_module(f"pipelines.commands.{COMMANDS[name].module}")
    return next(command for command in module.COMMANDS if command.name == name)


class LazyGroup(click.Group):
    """A group whose subcommands are COMMANDS, each imported on first use; `prepare(command)` runs once
    on each as it is loaded."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.loaded: dict[str, click.Command] = {}

    def prepare(self, command: click.Command) -> click.Command:
        return command

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        if name not in self.loaded:
            self.loaded[name] = self.prepare(load_command(name))
        return self.loaded[name]

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Commands"):
            formatter.write_dl([(name, COMMANDS[name].summary) for name in self.list_commands(ctx)])
