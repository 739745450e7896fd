"""`vlbert data prepare SOURCE`: a benchmark's published files → the project's annotation files."""

from pathlib import Path

import click

from pipelines.commands.values import FiniteFloatRange
from train.data.prepare import SourceOption, prepare_dataset
from train.data.sources import SOURCES


@click.group("data")
def data_group() -> None:
    """Prepare published datasets for extraction and training."""


def _help() -> str:
    sources = "\n".join(f"  {name}: {source.about}" for name, source in SOURCES.items())
    return f"""Read SOURCE's published files under --root into --out: a JSON-lines annotation file per
split found, images.txt (the images to extract), boxes.json (given-box sources: `vlbert extract
--boxes`), answers.txt (vqa2), skipped.jsonl (items left out, with the reason) and summary.json.
Images are found with any extension extraction reads. Files are renamed into place only when the
whole preparation succeeded; a failed one leaves --out as it was, and one that keeps no item fails.

\b
{sources}
"""


@data_group.command("prepare", help=_help())
@click.argument("source", type=click.Choice(list(SOURCES)))
@click.option("--root", required=True, type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="The folder holding the published annotation files.")
@click.option("--images", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="The images root (default: --root; vcr: --root/vcr1images).")
@click.option("--out", required=True, type=click.Path(file_okay=False, path_type=Path), help="Output folder; not --root or --images, nor inside or holding them.")
@click.option("--max-missing", type=FiniteFloatRange(0, 1),
              help="Fail when a split misses a larger share of its items' images (0-1; default: never).")
def prepare_command(source: str, root: Path, images: Path | None, out: Path, max_missing: float | None,
                    **options) -> None:
    options = {name: value for name, value in options.items() if value is not None}
    summary = prepare_dataset(SOURCES[source], root, out, images, max_missing, log=click.echo, **options)
    total = sum(split["items"] for split in summary["splits"].values())
    click.echo(f"{total} items in {len(summary['splits'])} splits: {out.resolve() / 'summary.json'}")


def _source_options() -> list[click.Option]:
    """An option for each of the sources' options (train/data/sources), its help naming the sources."""
    sources: dict[str, list[str]] = {}
    declared = {}
    for source in SOURCES.values():
        for option in source.options:
            sources.setdefault(option.name, []).append(source.name)
            declared.setdefault(option.name, option)
    return [click.Option([f"--{name.replace('_', '-')}", name], type=_parameter_type(option),
                         help=f"{', '.join(sources[name])}: {option.help}") for name, option in declared.items()]


def _parameter_type(option: SourceOption) -> click.ParamType:
    if option.type is Path:
        return click.Path(exists=True, dir_okay=False, path_type=Path)
    if option.type is int:
        return click.IntRange(option.minimum)
    return click.STRING


prepare_command.params.extend(_source_options())


@data_group.command("sbu-urls")
@click.option("--root", required=True, type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="The folder holding SBU_captioned_photo_dataset_{urls,captions}.txt.")
@click.option("--out", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="The parquet file to write (e.g. sbu.parquet).")
def sbu_urls_command(root: Path, out: Path) -> None:
    """img2dataset's input for SBU Captions: the two published files joined into a parquet table
    (url, caption), a row per line, so that img2dataset's keys are what `vlbert data prepare sbu`
    names images by. Then: img2dataset --url_list OUT --input_format parquet --url_col url
    --caption_col caption --output_format webdataset --output_folder IMAGES/sbu"""
    from train.data.sources.sbu import write_sbu_url_table

    rows = write_sbu_url_table(root, out)
    click.echo(f"{rows} rows: {out}")

COMMANDS = [data_group]
