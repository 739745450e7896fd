"""`vlbert cache info|verify|export|import|show`: inspect, check, convert and look at FeatureStores."""

import json
from pathlib import Path

import click

from extract.store.audit import store_info, verify_store
from extract.store.interop import EXPORT_FORMATS, FORMATS, IMPORT_FILES, export_store, import_store
from extract.store.schema import FEATURE_ENCODINGS, StoreError, feature_dtype_help
from pipelines.commands.values import FiniteFloatRange

_store_path = click.Path(exists=True, file_okay=False, path_type=Path)


@click.group("cache")
def cache_group() -> None:
    """Inspect, verify and convert FeatureStores."""


@cache_group.command("info")
@click.argument("cache", type=_store_path)
@click.option("--json", "as_json", is_flag=True, help="One JSON object (records, failures, bytes, meta, shards).")
def info_command(cache: Path, as_json: bool) -> None:
    """Record and failure counts, size on disk and meta.json of CACHE (damaged shards are listed,
    not read)."""
    info = store_info(cache)
    if as_json:
        click.echo(json.dumps(info))
        return
    meta = info["meta"]
    per_record = f" ({info['bytes_per_record'] / 1024:.1f} KiB per record)" if info["records"] else ""
    click.echo(f"{cache}: {info['records']} records, {info['failures']} failures, "
               f"{info['bytes'] / 2**20:.1f} MiB on disk{per_record}")
    detector = meta.get("detector") or {}
    click.echo(f"mode {meta['mode']}, detector {detector.get('source', '-')}, "
               f"features {meta['features']['dim']}-d {meta['features']['dtype']}, "
               f"mask variants {meta['mask_variants']['count']}")
    for shard in info["shards"]:
        click.echo(f"  {shard['name']}: {shard['records']} records")
    for damage in info["damaged_shards"]:
        click.echo(f"  {damage}")


@cache_group.command("verify")
@click.argument("cache", type=_store_path)
def verify_command(cache: Path) -> None:
    """Check every shard file, every record's checksum and its agreement with meta.json; exit 1
    listing what is wrong (each damaged record by name), or saying that it holds no record."""
    result = verify_store(cache)
    for problem in result.problems:
        click.echo(problem)
    if result.problems:
        raise click.ClickException(f"{len(result.problems)} problem(s) in {cache}")
    if not result.records:
        # Exit 1: nothing was verified, and every consumer of the store (training, export) would
        # find nothing in it; `cache verify && vlbert train` must stop here.
        raise StoreError(f"{cache}: empty store (0 records): nothing to verify")
    unchecked = (f", {result.unchecked} written before records had checksums (unchecked)"
                 if result.unchecked else "")
    click.echo(f"{cache}: OK ({result.records} records, {result.records - result.unchecked} checksums match"
               f"{unchecked})")


@cache_group.command("export")
@click.argument("cache", type=_store_path)
@click.option("--format", "fmt", required=True, type=click.Choice(EXPORT_FORMATS))
@click.option("--out", required=True, type=click.Path(path_type=Path),
              help="npz: a new or empty directory (OUT/<id>.npz); tsv, h5: a file. Not in CACHE, nor holding it.")
def export_command(cache: Path, fmt: str, out: Path) -> None:
    """Write every record of CACHE as npz files, a bottom-up-attention TSV or a VQA-style HDF5 file.

    A damaged record, records that disagree with meta.json, or an image id that could name a file
    outside an npz export's folder ('..', an absolute path, a NUL byte, an empty or '.' component)
    stop the export with nothing written.
    """
    count = export_store(cache, fmt, out)
    click.echo(f"{count} records → {out}")


@cache_group.command("import")
@click.argument("src", type=click.Path(exists=True, path_type=Path))
@click.option("--format", "fmt", required=True, type=click.Choice(list(FORMATS)))
@click.option("--out", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="New FeatureStore (absent, or an empty folder; not in SRC).")
@click.option("--feature-dtype", type=click.Choice(list(FEATURE_ENCODINGS)), default="float16", show_default=True,
              help=feature_dtype_help())
@click.option("--ids", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help=f"h5: {IMPORT_FILES['ids']} (imgid2idx.pkl, or .json: {{id: row}} or a list of ids by row).")
@click.option("--labels", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help=f"vinvl-tsv: {IMPORT_FILES['labels']}, for the image sizes (without it: a nominal size).")
def import_command(src: Path, fmt: str, out: Path, feature_dtype: str, ids: Path | None, labels: Path | None) -> None:
    """Build a FeatureStore from SRC, in the format another project wrote it (docs/extraction.md
    lists them); warns, field by field, what the source format cannot carry.

    The store is built beside OUT and renamed into place when every record is in: an image id
    given twice, one that could name a file outside an npz export's folder, an image size that is
    not a positive whole number, a record unlike the first (a missing field, a wrong shape), or any
    malformed line, base64 field or pickle stops it with no OUT left.
    """
    count = import_store(src, fmt, out, feature_dtype, ids=ids, labels=labels)
    click.echo(f"{count} records → {out}")


@cache_group.command("show")
@click.argument("cache", type=_store_path)
@click.argument("ids", nargs=-1, required=True)
@click.option("--images", help="The images root, a folder or tar shards as `vlbert extract --images` takes them "
                                "[default: the images root the store records].")
@click.option("--out", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Folder of the pictures: OUT/<id>.png (not in CACHE or the images).")
@click.option("--variant", type=click.IntRange(min=0), help="Hatch the boxes whose pixels masked-pixel variant K hid.")
@click.option("--top", type=click.IntRange(min=1), help="Draw only the N most confident boxes.")
@click.option("--min-score", type=FiniteFloatRange(0.0, 1.0),
              help="Draw only boxes whose class score is at least this.")
@click.option("--sheet", is_flag=True, help="Also write OUT/sheet.png: every picture on one contact sheet.")
def show_command(cache: Path, ids: tuple[str, ...], images: str | None, out: Path, variant: int | None,
                 top: int | None, min_score: float | None, sheet: bool) -> None:
    """Draw the stored boxes of each image ID over its image: the top class and attribute with their
    scores (names from the store's meta.json), the whole-image box dashed, the pixels of a masked
    variant hatched. An ID the store lacks, or whose image is not found, is named in one line and the
    others are drawn; exit status 1 when any is left out."""
    from pipelines.report.cache_show import show_records

    result = show_records(cache, list(ids), out, images, variant, top, min_score, sheet, log=click.echo)
    if result.note:
        click.echo(f"Note: {result.note}")
    for path in result.written:
        click.echo(str(path))
    for problem in result.problems:
        click.echo(f"not drawn: {problem}", err=True)
    if result.problems:
        raise click.exceptions.Exit(1)


COMMANDS = [cache_group]
