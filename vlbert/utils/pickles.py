"""Pickles from others (model-zoo detector weights, the refer toolkit's refs files), loaded without
running any of their code.

A pickle runs code by naming a global (a class, a function) and calling it. `load_pickle` names
only what an allow-list (`PickleContent`) holds: `PLAIN_DATA` allows no global at all (lists,
dicts, tuples, strings, bytes, numbers, booleans, None); `ARRAYS` adds what NumPy's own pickles of
arrays, scalars and dtypes call (Python 2's model-zoo and caffe-converted files, and Python 3's
protocols 2 to 5), and `collections.OrderedDict` read as a dict; `OBJECT_ARRAYS` adds NumPy
object arrays whose elements are themselves such data (what `np.save` pickles for a dict, as
bottom-up-attention.pytorch's `info` and MMF's `_info.npy` hold). Any other global is refused
before it is looked up, so nothing is imported and nothing is run. The array constructors are
taken as NumPy pickles call them: an array starts empty and is filled from the file's bytes (an
object array from the list of elements already loaded); the `ndarray` class is handed over as a
token that cannot be called, so no array is allocated beyond what the file holds. Only numbers load
(no text or structured arrays; object arrays only under `OBJECT_ARRAYS`), and BUILD hands NumPy's
`__setstate__` only states NumPy itself writes: it trusts its input, and a short dtype state crashes
the process.

The memory it takes stays proportional to the file's size. It is built on pickle's Python
implementation, whose memo is a dict: the C one allocates an array as long as the largest memo
index a file names, so a few bytes can demand gigabytes (CPython gh-115952, fixed after 3.13).
A bytearray is allocated at the size the file states before it is read: a size beyond the file is
refused, and so is an integer longer than Python converts to text (a LONG4 of more than LONG_BYTES
bytes). It reads a refs file of 50,000 refs in about 7 s where the C one takes 4 s.
"""

from __future__ import annotations

import functools
import io
import math
import pickle
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from vlbert.utils.errors import UserError

try:
    from numpy._core import multiarray, numeric
except ImportError:  # NumPy 1.x
    from numpy.core import multiarray, numeric

LONG_BYTES = 1024  # 2,466 decimal digits: below the 4,300 Python converts to text, far above any id
NUMBER_KINDS = "biufc"  # bool, signed and unsigned integers, floats, complex numbers


class _NdarrayToken:
    """Stands for `numpy.ndarray` in a pickle: `_reconstruct` takes it; calling it does nothing."""


_NDARRAY = _NdarrayToken()


def _numbers(dtype: Any, *, objects: bool = False) -> np.dtype:
    """`dtype` when it describes numbers, one to an element (or, with `objects`, Python objects);
    UnpicklingError otherwise."""
    kinds = NUMBER_KINDS + ("O" if objects else "")
    if not isinstance(dtype, np.dtype) or dtype.kind not in kinds or dtype.subdtype is not None:
        raise pickle.UnpicklingError(f"an array or scalar of {dtype!r}: only numbers load")
    return dtype


def _raw_bytes(data: Any, size: int) -> bytes:
    """An array's or scalar's `size` bytes as pickled (Python 2's byte strings arrive as latin-1 text)."""
    if isinstance(data, str):
        data = data.encode("latin1")
    if not isinstance(data, bytes) or len(data) != size:
        raise pickle.UnpicklingError(f"{size} bytes expected for an array or scalar, found {type(data).__name__} "
                                     f"of {len(data) if isinstance(data, (bytes, str)) else 'no'} bytes")
    return data


def _dtype(spec: Any, align: Any = False, copy: Any = True, *, objects: bool = False) -> np.dtype:
    """`numpy.dtype` as its pickles call it: a new descriptor (never the shared one, which BUILD would
    change for the whole process) of numbers (or objects), from its text."""
    if not isinstance(spec, str):
        raise pickle.UnpicklingError(f"a NumPy dtype given as {type(spec).__name__}")
    return _numbers(np.dtype(spec, copy=True), objects=objects)


def _reconstruct(subtype: Any, shape: Any, dtype: Any) -> np.ndarray:
    """numpy's `_reconstruct` as its pickles call it: an empty ndarray that BUILD then fills."""
    if subtype is not _NDARRAY or shape != (0,) or dtype not in (b"b", "b"):
        raise pickle.UnpicklingError("an array not rebuilt as NumPy pickles one (an empty ndarray filled from "
                                     "the file)")
    return multiarray._reconstruct(np.ndarray, shape, dtype)


def _scalar(dtype: Any, data: Any) -> np.generic:
    """numpy's `scalar` for a number: its dtype and exactly its bytes."""
    dtype = _numbers(dtype)
    return multiarray.scalar(dtype, _raw_bytes(data, dtype.itemsize))


def _frombuffer(buffer: Any, dtype: Any, *layout: Any) -> np.ndarray:
    """numpy's `_frombuffer` (protocol 5) for numbers: an array over the file's own bytes."""
    return numeric._frombuffer(buffer, _numbers(dtype), *layout)


def _latin1_bytes(text: Any, encoding: Any = "latin1") -> bytes:
    """`_codecs.encode` as Python 3 pickles bytes under protocol 2: latin-1 text back to its bytes."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise pickle.UnpicklingError(f"_codecs.encode is read only for latin-1 text, not {encoding!r}")
    return text.encode("latin1")


def _build_dtype(dtype: np.dtype, state: Any) -> None:
    """A dtype's byte order, from the state numpy writes for it and nothing else: numpy's own
    `__setstate__` trusts its input (a short tuple crashes the process)."""
    endian = state[1] if isinstance(state, tuple) and len(state) in (8, 9) else None
    if endian not in ("<", ">", "|", "="):
        raise pickle.UnpicklingError("a NumPy dtype state that NumPy does not write")
    expected = dtype.newbyteorder(endian).__reduce__()[2]
    if state[0] not in (3, 4) or state[1:8] != expected[1:8] or state[8:] not in ((), (None,)):
        raise pickle.UnpicklingError("a NumPy dtype state that NumPy does not write")
    dtype.__setstate__(expected)


def _build_array(array: np.ndarray, state: Any, *, objects: bool = False) -> None:
    """An empty array filled from its pickled state (version, shape, dtype, Fortran order, bytes; for
    an object array, the list of its elements, loaded already), checked before numpy's own
    `__setstate__` sees it."""
    if not (isinstance(state, tuple) and len(state) == 5 and state[0] == 1):
        raise pickle.UnpicklingError("a NumPy array state that NumPy does not write")
    _, shape, dtype, fortran, data = state
    if not (isinstance(shape, tuple) and len(shape) <= 32 and all(type(n) is int and n >= 0 for n in shape)
            and type(fortran) is bool):
        raise pickle.UnpicklingError(f"a NumPy array of shape {shape!r}")
    if _numbers(dtype, objects=objects).kind == "O":
        if not (type(data) is list and len(data) == math.prod(shape)):
            raise pickle.UnpicklingError(f"an object array of shape {shape!r} whose elements are not a list of "
                                         f"{math.prod(shape)}")
        array.__setstate__((1, shape, dtype, fortran, data))
        return
    size = math.prod(shape) * dtype.itemsize
    array.__setstate__((1, shape, dtype, fortran, _raw_bytes(data, size)))


@dataclass(frozen=True)
class PickleContent:
    """What a pickle may hold: `what` names it in a refusal; `allowed` maps each global a pickle may
    name ("module.name") to what it stands for; `builds` each type BUILD may fill to how it is filled."""

    what: str
    allowed: Mapping[str, Any] = field(default_factory=dict)
    builds: Mapping[type, Callable[[Any, Any], None]] = field(default_factory=dict)


PLAIN_DATA = PickleContent("plain data")
ARRAYS = PickleContent("plain data and NumPy arrays", {
    **{f"{module}.multiarray._reconstruct": _reconstruct for module in ("numpy.core", "numpy._core")},
    **{f"{module}.multiarray.scalar": _scalar for module in ("numpy.core", "numpy._core")},
    **{f"{module}.numeric._frombuffer": _frombuffer for module in ("numpy.core", "numpy._core")},
    "numpy.ndarray": _NDARRAY,
    "numpy.dtype": _dtype,
    "_codecs.encode": _latin1_bytes,
    "collections.OrderedDict": dict,
}, {np.ndarray: _build_array, np.dtype: _build_dtype})
OBJECT_ARRAYS = PickleContent("plain data and NumPy arrays, of numbers or of such data", {
    **ARRAYS.allowed, "numpy.dtype": functools.partial(_dtype, objects=True),
}, {np.ndarray: functools.partial(_build_array, objects=True), np.dtype: _build_dtype})


class _RefusedGlobal(Exception):
    pass


class _AllowListUnpickler(pickle._Unpickler):
    def __init__(self, data: bytes, content: PickleContent, encoding: str) -> None:
        super().__init__(io.BytesIO(data), encoding=encoding)
        self.content = content
        self.size = len(data)

    def find_class(self, module: str, name: str) -> Any:
        qualified = f"{module}.{name}"
        if qualified not in self.content.allowed:
            raise _RefusedGlobal(qualified if qualified.isprintable() else ascii(qualified))  # keeps the error one line
        return self.content.allowed[qualified]

    def _load_checked_build(self) -> None:
        state = self.stack.pop()
        target = self.stack[-1]
        build = next((build for kind, build in self.content.builds.items() if isinstance(target, kind)), None)
        if build is None:
            raise pickle.UnpicklingError(f"a {type(target).__name__} is not built from a state")
        build(target, state)

    def _load_bounded_bytearray8(self) -> None:
        size, = struct.unpack("<Q", self.read(8))
        if size > self.size:
            raise pickle.UnpicklingError(f"a bytearray of {size} bytes in a file of {self.size}")
        self.append(bytearray(self.read(size)))

    def _load_bounded_long4(self) -> None:
        size, = struct.unpack("<i", self.read(4))
        if not 0 <= size <= LONG_BYTES:
            raise pickle.UnpicklingError(f"an integer of {size} bytes (at most {LONG_BYTES} are read)")
        self.append(pickle.decode_long(self.read(size)))

    dispatch: dict[int, Callable] = {**pickle._Unpickler.dispatch, pickle.BUILD[0]: _load_checked_build,
                                     pickle.BYTEARRAY8[0]: _load_bounded_bytearray8,
                                     pickle.LONG4[0]: _load_bounded_long4}


def load_pickle(path: str | Path, error: type[UserError], content: PickleContent = PLAIN_DATA,
                encoding: str = "UTF-8") -> Any:
    """What the pickle `path` holds, when it is `content`; else `error`, one line naming the file (and
    the global refused, before anything was looked up or run). `encoding` reads Python 2 byte
    strings: UTF-8 for text (latin-1 would turn non-ASCII text into mojibake silently), latin-1 for
    NumPy arrays, whose bytes Python 2 pickled as byte strings."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise error(f"{path}: cannot read ({exc.strerror or exc})") from None
    return loads_pickle(data, str(path), error, content, encoding)


def loads_pickle(data: bytes, where: str, error: type[UserError], content: PickleContent = PLAIN_DATA,
                 encoding: str = "UTF-8") -> Any:
    """`load_pickle` for a pickle's bytes (an LMDB value, a member of an archive); `where` names them."""
    try:
        return _AllowListUnpickler(data, content, encoding).load()
    except _RefusedGlobal as exc:
        raise error(f"{where}: refused to load {exc}: the file holds more than {content.what}") from None
    except UnicodeDecodeError as exc:
        raise error(f"{where}: holds a Python 2 byte string that is not {encoding} text ({exc.reason})") from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, KeyError, IndexError, AttributeError,
            OverflowError, MemoryError, struct.error, RecursionError) as exc:
        raise error(f"{where}: not a readable pickle ({type(exc).__name__}: {exc})") from None
