"""Files from others run no code and write nowhere else: weights pickles, record ids that would
leave an export's folder, imports that fail or repeat an id, image sizes that are no size, texts
that are no text, and vocabulary sizes no trainer can allocate."""

import io
import json
import os
import pickle
import pickletools
import struct
from pathlib import Path

import h5py
import numpy as np
import pytest
from click.testing import CliRunner

from extract import Detector
from extract.checkpoint import CheckpointError, read_state_dict
from extract.store import FeatureStore, FeatureStoreWriter
from extract.store.interop import IMPORT_BATCH, TSV_FIELDS
from extract.synthetic import write_synthetic_images
from pipelines.cli import main
from tests.helpers.detection import randomized_state
from tests.helpers.stores import QUIET_LOSSES, meta, synthetic_record
from vlbert.utils.errors import FAILED, USAGE, UserError
from vlbert.utils.paths import OutsidePathError, outside_reason, path_inside
from vlbert.utils.pickles import ARRAYS, PLAIN_DATA, load_pickle


def invoke(*arguments) -> tuple[int, list[str]]:
    result = CliRunner().invoke(main, [str(a) for a in arguments])
    assert "Traceback" not in result.output
    return result.exit_code, result.output.splitlines()


def tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


# ---- pickled weights ------------------------------------------------------------------------------

class RunsAShellCommand:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


class Python2Pickler(pickle._Pickler):
    """Pickles as Python 2's cPickle did at protocol 2: byte strings as Python 2 `str`
    (SHORT_BINSTRING / BINSTRING), NumPy's constructors under `numpy.core` (as Python 2's NumPy named them)."""

    def save_bytes(self, obj: bytes) -> None:
        size = len(obj)
        self.write(pickle.SHORT_BINSTRING + bytes([size]) if size < 256 else pickle.BINSTRING + struct.pack("<i", size))
        self.write(obj)
        self.memoize(obj)

    dispatch = {**pickle._Pickler.dispatch, bytes: save_bytes}


def python2_pickle(value) -> bytes:
    stream = io.BytesIO()
    Python2Pickler(stream, protocol=2).dump(value)
    return stream.getvalue().replace(b"cnumpy._core.", b"cnumpy.core.")


@pytest.mark.parametrize("payload, refused", [
    (lambda marker: pickle.dumps({"model": RunsAShellCommand(marker)}, protocol=2), f"{os.system.__module__}.system"),
    (lambda marker: f"cbuiltins\neval\n(S'open(\"{marker}\", \"w\")'\ntR.".encode(), "builtins.eval"),
    (lambda marker: b"\x80\x02cnumpy\nload\nq\x00.", "numpy.load"),
])
def test_a_weights_pickle_that_would_run_code_is_refused_and_nothing_runs(tmp_path, payload, refused):
    marker = tmp_path / "pwned"
    weights = tmp_path / "weights.pkl"
    weights.write_bytes(payload(marker))
    assert "GLOBAL" in {op.name for op, _, _ in pickletools.genops(weights.read_bytes())}
    write_synthetic_images(tmp_path / "images", 1)
    status, lines = invoke("extract", "--images", tmp_path / "images", "--out", tmp_path / "store", "--detector",
                           "tiny", "--weights", weights, "--quiet")
    assert (status, lines) == (USAGE, [f"Error: {weights}: refused to load {refused}: the file holds more than plain "
                                       "data and NumPy arrays"])
    assert not marker.exists() and not (tmp_path / "store").exists()


def test_numpy_constructors_are_taken_only_as_numpy_pickles_call_them(tmp_path):
    """The ndarray class cannot be called (it would allocate what a few bytes ask for), an array is
    rebuilt only empty, then filled from the file's bytes, and numpy's own __setstate__ sees only
    states numpy writes (this short dtype state makes `pickle.loads` crash the process)."""
    path = tmp_path / "model.pkl"
    for stream in (b"\x80\x02cnumpy\nndarray\nJ\x00\x00\x00\x40\x85R.",  # ndarray((2**30,))
                   b"\x80\x02cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\nJ\x00\x00\x00\x40\x85U\x01b\x87R.",
                   b"\x80\x02cnumpy\ndtype\nX\x02\x00\x00\x00i8\x89\x88\x87R(K\x03X\x01\x00\x00\x00<NJ\xff\xff\xff\xff"
                   b"J\xff\xff\xff\xffK\x00tb."):
        path.write_bytes(stream)
        with pytest.raises(CheckpointError, match=f"^{path}: not a readable pickle "):
            read_state_dict(path)
    big_endian = np.arange(3, dtype=">f8")
    path.write_bytes(pickle.dumps({"model": {"w": big_endian}}, protocol=2))
    assert read_state_dict(path)["w"].tolist() == [0.0, 1.0, 2.0]
    assert np.dtype("f8").byteorder == "=" and np.zeros(1).dtype.isnative  # no shared descriptor was changed


@pytest.mark.parametrize("writer", ["python 2", "protocol 2", "protocol 5"])
def test_a_model_zoo_pickle_of_numpy_arrays_loads_bitwise(tmp_path, writer):
    state = randomized_state(Detector.build("tiny"))
    state["backbone.res2.0.conv1.weight"][0, 0, 0, 0] = np.nan  # bits, not values, must survive
    def text(name: str) -> str | bytes:  # Python 2's are byte strings, read as latin-1
        return name.encode() if writer == "python 2" else name

    document = {"model": {text(key): value for key, value in state.items()}, "__author__": text("Detectron"),
                "matching_heuristics": True, "scale": np.float64(0.25)}
    if writer == "python 2":
        stream = python2_pickle(document)
        opcodes = {(op.name, arg) for op, arg, _ in pickletools.genops(stream)}
        assert {("GLOBAL", "numpy.core.multiarray _reconstruct"), ("GLOBAL", "numpy.core.multiarray scalar")} <= opcodes
        assert not any(arg and "_codecs" in str(arg) for _, arg in opcodes)
    else:
        stream = pickle.dumps(document, protocol=int(writer[-1]))
    path = tmp_path / "model_final.pkl"
    path.write_bytes(stream)
    loaded = read_state_dict(path)
    assert sorted(loaded) == sorted(state)
    for key, value in state.items():
        assert loaded[key].numpy().tobytes() == value.tobytes() and loaded[key].dtype.is_floating_point, key
    whole = load_pickle(path, UserError, ARRAYS, encoding="latin1")
    assert whole["__author__"] == "Detectron" and whole["scale"] == 0.25


def test_plain_data_allows_no_global_and_arrays_need_their_allow_list(tmp_path):
    path = tmp_path / "x.pkl"
    path.write_bytes(pickle.dumps([np.arange(3)]))
    with pytest.raises(UserError, match=r"refused to load numpy\._?core\.multiarray\._reconstruct: the file holds "
                                        "more than plain data$"):
        load_pickle(path, UserError, PLAIN_DATA)
    assert load_pickle(path, UserError, ARRAYS)[0].tolist() == [0, 1, 2]
    for odd in (np.array(["x", None], dtype=object), np.zeros(2, [("x", "f4")]), np.array(["text"])):
        path.write_bytes(pickle.dumps({"model": {"a": odd}}))
        with pytest.raises(CheckpointError, match=r"not a readable pickle \(UnpicklingError: an array or scalar of "
                                                  r"dtype\(.*\): only numbers load\)$"):
            read_state_dict(path)


# ---- record ids as paths --------------------------------------------------------------------------

UNSAFE_IDS = {"../../escaped": "has a '..' component", "/tmp/absolute": "is an absolute path",
              "a\0b": "holds a NUL byte", "a/../b": "has a '..' component", "a//b": "has an empty or '.' component",
              "a/./b": "has an empty or '.' component", "folder/": "has an empty or '.' component"}


def test_a_name_that_could_leave_its_folder_is_refused(tmp_path):
    for name, reason in UNSAFE_IDS.items():
        assert outside_reason(name) == reason
        with pytest.raises(OutsidePathError, match=f"record id .* {reason}: it would make a path outside {tmp_path}"):
            path_inside(tmp_path, name)
    assert path_inside(tmp_path, "a/b c\\d\t.e") == tmp_path / "a" / "b c\\d\t.e"
    # An image path read from a list may take `.` steps; `..` steps never (a symlinked folder leads elsewhere).
    assert path_inside(tmp_path, "./a//b.png", record_id=False) == tmp_path / "a" / "b.png"
    assert outside_reason("a/../b.png", record_id=False) == "has a '..' component"
    assert outside_reason("./", record_id=False) == "names the folder itself"
    assert OutsidePathError.exit_status == USAGE


def tsv_line(image_id: str, img_h: str = "80", boxes: int = 1, dim: int = 4) -> str:
    def b64(array):
        import base64
        return base64.b64encode(np.ascontiguousarray(array, "<f4").tobytes()).decode()
    fields = {"img_id": image_id, "img_h": img_h, "img_w": "120", "objects_id": "", "objects_conf": "", "attrs_id": "",
              "attrs_conf": "", "num_boxes": str(boxes), "boxes": b64(np.tile([1, 2, 30, 40], (boxes, 1))),
              "features": b64(np.full((boxes, dim), 0.5))}
    return "\t".join(fields[name] for name in TSV_FIELDS) + "\n"


def write_tsv(path: Path, ids) -> Path:
    path.write_text("".join(tsv_line(image_id) for image_id in ids))
    return path


@QUIET_LOSSES
@pytest.mark.parametrize("unsafe", sorted(UNSAFE_IDS))
def test_an_id_that_could_leave_the_export_folder_is_refused_at_import(tmp_path, unsafe):
    tsv = tmp_path / "features.tsv"
    tsv.write_text(tsv_line("fine") + tsv_line(unsafe.replace("\\", "\\\\")))
    before = tree(tmp_path)
    status, lines = invoke("cache", "import", tsv, "--format", "tsv", "--out", tmp_path / "store")
    assert (status, lines) == (FAILED, [f"Error: {tsv} line 2: image id {unsafe!r} {UNSAFE_IDS[unsafe]}; an npz "
                                        "export writes <id>.npz, which must stay inside its folder"])
    assert tree(tmp_path) == before


@QUIET_LOSSES
def test_an_id_that_could_leave_the_export_folder_is_refused_at_export_in_every_format(tmp_path):
    """Such ids reach a store only by imports from before they were refused."""
    store = tmp_path / "inside" / "store"
    with FeatureStoreWriter(store, meta()) as writer:
        writer.commit({"fine": synthetic_record("fine"), "../../escaped": synthetic_record("x"),
                       "a\0b": synthetic_record("y")})
    before = tree(tmp_path)
    for fmt, out in (("npz", tmp_path / "inside" / "npz"), ("tsv", tmp_path / "x.tsv"), ("h5", tmp_path / "x.h5")):
        status, lines = invoke("cache", "export", store, "--format", fmt, "--out", out)
        assert status == FAILED and len(lines) == 1, lines
        assert lines[0] in (f"Error: {store}: image id {unsafe!r} {UNSAFE_IDS[unsafe]}; an npz export writes <id>.npz, "
                            "which must stay inside its folder" for unsafe in ("../../escaped", "a\0b"))
        assert tree(tmp_path) == before


@QUIET_LOSSES
def test_an_unsafe_id_in_an_hdf5_file_is_refused(tmp_path):
    path = tmp_path / "f.h5"
    with h5py.File(path, "w") as f:
        f["image_features"] = np.ones((2, 1, 4), np.float32)
        f["image_bb"] = np.tile(np.float32([1, 2, 30, 40]), (2, 1, 1))
        f["image_ids"] = np.array(["fine", "/etc/escaped"], dtype=h5py.string_dtype())
        f["image_h"], f["image_w"] = np.array([80, 80]), np.array([120, 120])
    status, lines = invoke("cache", "import", path, "--format", "h5", "--out", tmp_path / "store")
    assert (status, lines) == (FAILED, [f"Error: {path} row 1: image id '/etc/escaped' is an absolute path; an npz "
                                        "export writes <id>.npz, which must stay inside its folder"])
    assert not (tmp_path / "store").exists()


# ---- imports: atomic, counted, each id once ------------------------------------------------------

def staging_folders(tmp_path: Path) -> list[str]:
    return [p.name for p in tmp_path.iterdir() if ".importing-" in p.name]


@QUIET_LOSSES
def test_a_failed_import_leaves_nothing_that_verify_accepts(tmp_path):
    tsv = tmp_path / "features.tsv"
    tsv.write_text("".join(tsv_line(f"image{n}") for n in range(300)) + "broken\tline\n")
    status, lines = invoke("cache", "import", tsv, "--format", "tsv", "--out", tmp_path / "store")
    assert IMPORT_BATCH < 300  # a batch was committed before line 301 was read
    assert (status, lines) == (FAILED, [f"Error: {tsv} line 301: 2 tab-separated fields, expected 10 (img_id, img_h, "
                                        "img_w, objects_id, objects_conf, attrs_id, attrs_conf, num_boxes, boxes, "
                                        "features) or 6"])
    assert not (tmp_path / "store").exists() and not staging_folders(tmp_path)
    status, _ = invoke("cache", "verify", tmp_path / "store")
    assert status != 0


@QUIET_LOSSES
def test_an_id_given_twice_is_refused_naming_both_lines(tmp_path):
    tsv = write_tsv(tmp_path / "features.tsv", ["a", "b", "a"])
    status, lines = invoke("cache", "import", tsv, "--format", "tsv", "--out", tmp_path / "store")
    assert (status, lines) == (FAILED, [f"Error: {tsv}: image id 'a' is on line 1 and again on line 3; a store holds "
                                        "each id once"])
    assert not (tmp_path / "store").exists() and not staging_folders(tmp_path)


@QUIET_LOSSES
def test_the_count_printed_is_the_count_stored_and_out_must_be_new_or_empty(tmp_path):
    tsv = write_tsv(tmp_path / "features.tsv", ["a", "b", "c"])
    (tmp_path / "store").mkdir()
    status, lines = invoke("cache", "import", tsv, "--format", "tsv", "--out", tmp_path / "store")
    assert (status, lines) == (0, [f"3 records → {tmp_path / 'store'}"])
    with FeatureStore(tmp_path / "store") as store:
        assert store.keys() == ["a", "b", "c"]
    assert invoke("cache", "verify", tmp_path / "store")[0] == 0
    status, lines = invoke("cache", "import", tsv, "--format", "tsv", "--out", tmp_path / "store")
    assert (status, lines) == (FAILED, [f"Error: {tmp_path / 'store'}: exists and is not an empty folder; import "
                                        "into a new one"])


@QUIET_LOSSES
def test_a_killed_imports_staging_folder_is_swept_and_a_live_ones_is_not(tmp_path):
    tsv = write_tsv(tmp_path / "features.tsv", ["a"])
    killed, live = tmp_path / ".store.importing-999999", tmp_path / ".store.importing-999998"
    with FeatureStoreWriter(killed, meta()) as writer:  # closed: as a killed process's lock, released
        writer.commit({"x": synthetic_record("x")})
    with FeatureStoreWriter(live, meta()) as writer:
        writer.commit({"y": synthetic_record("y")})
        assert invoke("cache", "import", tsv, "--format", "tsv", "--out", tmp_path / "store")[0] == 0
        assert staging_folders(tmp_path) == [live.name]
    with FeatureStore(tmp_path / "store") as store:
        assert store.keys() == ["a"]


@QUIET_LOSSES
@pytest.mark.parametrize("value", ["inf", "nan", "-480", "0", "12.5", "1e400", "tall", ""])
def test_an_image_size_that_is_no_size_is_one_line_naming_the_line(tmp_path, value):
    tsv = tmp_path / "features.tsv"
    tsv.write_text(tsv_line("a") + tsv_line("b", img_h=value))
    status, lines = invoke("cache", "import", tsv, "--format", "tsv", "--out", tmp_path / "store")
    assert (status, lines) == (FAILED, [f"Error: {tsv} line 2: img_h {value!r} is not a positive whole number of "
                                        "pixels"])
    assert not (tmp_path / "store").exists()


@QUIET_LOSSES
def test_an_image_size_written_as_a_whole_float_is_read(tmp_path):
    tsv = tmp_path / "features.tsv"
    tsv.write_text(tsv_line("a", img_h="480.0"))
    invoke("cache", "import", tsv, "--format", "tsv", "--out", tmp_path / "store")
    with FeatureStore(tmp_path / "store") as store:
        assert store["a"]["image_h"] == 480


def malformed_npz(root: Path) -> Path:
    root.mkdir()
    np.savez(root / "x.npz", boxes=np.zeros((1, 4), np.float32), image_h=np.int64(3), image_w=np.int64(4))
    return root


def not_a_zip(root: Path) -> Path:
    root.mkdir()
    (root / "x.npz").write_bytes(pickle.dumps([1]))
    return root


def sizeless_h5(root: Path) -> Path:
    with h5py.File(root, "w") as f:
        f["image_features"], f["image_bb"] = np.ones((1, 1, 4), np.float32), np.ones((1, 1, 4), np.float32)
        f["image_ids"] = np.array(["a"], dtype=h5py.string_dtype())
    return root


def short_h5(root: Path) -> Path:
    sizeless_h5(root)
    with h5py.File(root, "a") as f:
        f["image_h"], f["image_w"] = np.array([], np.int64), np.array([], np.int64)
    return root


@QUIET_LOSSES
@pytest.mark.parametrize("make, fmt, error", [
    (malformed_npz, "npz", "{src}/x.npz: no features array of two dimensions (N, D)"),
    (not_a_zip, "npz", "{src}/x.npz: not a .npz file (not a zip archive)"),
    (sizeless_h5, "h5", "{src}: missing dataset(s) image_h (or spatial_features, to recover the image size from)"),
    (short_h5, "h5", "{src} row 0: malformed (Index (0) out of range"),
])
def test_a_malformed_source_is_one_line_naming_it(tmp_path, make, fmt, error):
    src = make(tmp_path / f"source.{fmt}")
    status, lines = invoke("cache", "import", src, "--format", fmt, "--out", tmp_path / "store")
    assert status == FAILED and len(lines) == 1 and lines[0].startswith("Error: " + error.format(src=src)), lines
    assert not (tmp_path / "store").exists() and not staging_folders(tmp_path)


# ---- vocabulary inputs -----------------------------------------------------------------------------

@pytest.mark.parametrize("option, value, error", [
    ("--size", 2 ** 64, f"size {2 ** 64}: expected 1 to 16,777,216 (2**24), far beyond any WordPiece vocabulary"),
    ("--size", 2 ** 24 + 1, f"size {2 ** 24 + 1}: expected 1 to 16,777,216 (2**24)"),
    ("--min-frequency", 2 ** 64, f"min_frequency {2 ** 64}: expected 1 to 2**64 - 1"),
])
def test_a_vocabulary_size_no_trainer_can_allocate_is_one_line(tmp_path, option, value, error):
    (tmp_path / "texts.txt").write_text("a dog runs\n")
    status, lines = invoke("vocab", "build", tmp_path / "texts.txt", "--out", tmp_path / "vocab", option, value)
    assert status == USAGE and len(lines) == 1 and lines[0].startswith(f"Error: {error}")
    assert not (tmp_path / "vocab").exists()


def test_a_lone_surrogate_in_an_annotation_is_one_line_naming_the_file(tmp_path):
    annotations = tmp_path / "train.jsonl"
    annotations.write_text(json.dumps({"file": "a.jpg", "captions": ["a dog \ud800 runs"]}) + "\n")
    assert "\\ud800" in annotations.read_text()  # as JSON writes it: valid UTF-8, an invalid string
    status, lines = invoke("vocab", "build", annotations, "--out", tmp_path / "vocab")
    assert (status, lines) == (USAGE, [f"Error: {annotations}: the text 'a dog \\ud800 runs' holds a lone surrogate "
                                       "('\\ud800'), which is no character"])
    assert not (tmp_path / "vocab").exists()
