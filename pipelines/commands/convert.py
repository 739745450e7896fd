"""`vlbert convert-official`: official VL-BERT checkpoints → this library's format."""

import os
from pathlib import Path

import click


@click.command("convert-official")
@click.argument("source", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="A new (or empty) directory for model.safetensors, config.json and, with a Fast R-CNN, detector.*",
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
    from vlbert.convert_official import convert_official_checkpoint
    from vlbert.utils.atomic import folder_written_whole
    from vlbert.utils.paths import check_apart

    check_apart(out_dir, (("SOURCE", source),))
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise CheckpointError(f"{out_dir}: exists and is not an empty folder; convert into a new one")
    # Filled beside OUT_DIR and renamed into place: a failure or a kill never leaves half a model there.
    staging = out_dir.with_name(f".{out_dir.name}.converting-{os.getpid()}")
    try:
        with folder_written_whole(out_dir, staging) as folder:
            result = convert_official_checkpoint(
                source, folder, num_attention_heads=num_attention_heads, trust_pickle=trust_pickle
            )
    except ValueError as error:  # the file is not a convertible checkpoint: nothing was written
        raise CheckpointError(str(error)) from error
    detector = "written" if result.has_detector else "absent"
    click.echo(f"{source} -> {out_dir}: {result.architecture}, detector {detector}")
    if result.initialised:
        click.echo(f"not in the checkpoint, initialised fresh: {', '.join(result.initialised)}")
    click.echo(f"dropped {len(result.dropped)} keys: " + "; ".join(sorted(set(result.dropped.values()))))


COMMANDS = [convert_official]
