"""`vlbert convert-official`: official VL-BERT checkpoints → this library's format."""

from pathlib import Path

import click



@click.command("convert-official")
@click.argument("source", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory for model.safetensors, config.json and, with a Fast R-CNN, detector.*",
)
@click.option(
    "--num-attention-heads",
    type=int,
    default=None,
    help="Not stored in the checkpoint; default hidden size / 64 (12 for base, 16 for large).",
)
@click.option(
    "--trust-pickle",
    is_flag=True,
    help="Unpickle the whole file (optimizer and validation state too); only for files you trust.",
)
def convert_official(source: Path, out_dir: Path, num_attention_heads: int | None, trust_pickle: bool) -> None:
    """Convert an official VL-BERT checkpoint SOURCE (e.g. vl-bert-base-e2e.model)."""
    from extract.checkpoint import CheckpointError
    from extract.paths import check_apart
    from vlbert.convert_official import convert_official_checkpoint

    check_apart(out_dir, (("SOURCE", source),))
    try:
        result = convert_official_checkpoint(
            source, out_dir, num_attention_heads=num_attention_heads, trust_pickle=trust_pickle
        )
    except ValueError as error:  # the file is not a convertible checkpoint: nothing was written
        raise CheckpointError(str(error)) from error
    detector = "written" if result.has_detector else "absent"
    click.echo(f"{source} -> {out_dir}: {result.architecture}, detector {detector}")
    if result.initialised:
        click.echo(f"not in the checkpoint, initialised fresh: {', '.join(result.initialised)}")
    click.echo(f"dropped {len(result.dropped)} keys: " + "; ".join(sorted(set(result.dropped.values()))))


COMMANDS = [convert_official]
