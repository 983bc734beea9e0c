"""GraphChallenge sparse-DNN files in and out.

The published formats, all tab-separated and 1-based:

* a layer ``n{N}-l{k}.tsv``: ``row<TAB>col<TAB>value``, entry (row, col) connects input neuron ``row`` to output
  neuron ``col``; a network is the files ``k = 1 .. L`` in a directory, or inside ``neuron{N}.tar.gz``;
* the inputs ``sparse-images-{N}.tsv[.gz]``: ``image<TAB>pixel<TAB>value``;
* the truth ``neuron{N}-l{L}-categories.tsv``: one 1-based image index per line.

Parsing is one compiled pass over the raw bytes (Numba), which also finds the first bad line, so a malformed file
costs nothing extra until it is reported. Every problem is raised as :class:`~dasknn.errors.DasknnError` naming
the file and line.
"""

from __future__ import annotations

import gzip
import os
import re
import tarfile
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numba
import numpy as np
import scipy.sparse as sp

from .errors import DasknnError
from .locations import is_url
from .network import Network, as_csc_layer, challenge_bias
from .partials import new_partial

LAYER_NAME = re.compile(r"(?:^|/)n(\d+)-l(\d+)\.tsv$")
IMAGES_NAME = re.compile(r"sparse-images-(\d+)\.tsv(?:\.gz)?$")
CATEGORIES_NAME = re.compile(r"neuron(\d+)-l(\d+)-categories\.tsv$")

# Codes the parser returns; the text is what the user reads.
_OK, _FEW, _MANY, _NOT_INT, _NOT_NUMBER, _NOT_FINITE, _ZERO_INDEX, _BIG_INDEX = range(8)
_MESSAGES = {
    _FEW: "too few columns (expected {ncols})",
    _MANY: "too many columns (expected {ncols})",
    _NOT_INT: "column {col} is not a positive integer index",
    _NOT_NUMBER: "column {col} is not a number",
    _NOT_FINITE: "column {col} is not finite (NaN or inf)",
    _ZERO_INDEX: "column {col} is 0, but indices are 1-based",
    _BIG_INDEX: "column {col} is {value}, out of range (at most {limit})",
}

# What an index beyond its limit means, column by column, in each file the challenge publishes.
_LAYER_BEYOND = ("input neuron {value} (column 1) is beyond the layer's {limit} neurons",
                 "output neuron {value} (column 2) is beyond the layer's {limit} neurons")
_IMAGE_BEYOND = "image {value} is beyond the batch's {limit} images"
_PIXEL_BEYOND = "pixel {value} is beyond the network's {limit} neurons"
_PIXEL_BEYOND_NAME = "pixel {value} is beyond the {limit} neurons the file's name gives"

_MAX_EXACT_POW10 = 22  # 10**22 is the largest power of ten a float64 holds exactly


@numba.njit(cache=True, nogil=True)
def _is_blank(c: int) -> bool:
    return c == 32 or c == 9 or c == 13  # space, tab, carriage return


#: What :func:`_parse_float` returns for a float the exact fast path leaves to Python.
_SLOW = len(_MESSAGES) + 1


@numba.njit(cache=True, nogil=True)
def _parse_index(buf, start, stop, limit):  # pragma: no cover - compiled
    """The 1-based index written in ``buf[start:stop]``: ``(value, _OK)``, ``(value, _BIG_INDEX)`` beyond
    ``limit``, or ``(0, error code)``."""
    if stop - start > 18:
        return 0, _NOT_INT
    v = 0
    for k in range(start, stop):
        d = buf[k] - 48
        if d < 0 or d > 9:
            return 0, _NOT_INT
        v = v * 10 + d
    if v == 0:
        return 0, _ZERO_INDEX
    if limit > 0 and v > limit:
        return v, _BIG_INDEX  # the value too: the message says what it was
    return v, _OK


@numba.njit(cache=True, nogil=True)
def _parse_float(buf, start, stop, powers):  # pragma: no cover - compiled
    """The decimal float in ``buf[start:stop]``: ``[sign] digits [. digits] [e|E [sign] digits]``.

    Returns ``(value, _OK)``; ``(0.0, _SLOW)`` where the exact fast path (Clinger's: at most 15 significant
    digits, |exponent| <= 22, ``powers`` the exact powers of ten) cannot convert it; or ``(0.0, error code)``
    (nan and inf are numbers, but not allowed).
    """
    k = start
    neg = False
    if buf[k] == 45 or buf[k] == 43:
        neg = buf[k] == 45
        k += 1
    mant = 0
    digits = 0
    exp10 = 0
    seen = 0
    while k < stop and 48 <= buf[k] <= 57:
        if mant == 0 and buf[k] == 48:
            pass  # leading zeros are not significant
        elif digits < 19:
            mant = mant * 10 + (buf[k] - 48)
            digits += 1
        else:
            exp10 += 1  # digits past 19 only scale; the slow path will see digits > 15
            digits += 1
        seen += 1
        k += 1
    if k < stop and buf[k] == 46:
        k += 1
        while k < stop and 48 <= buf[k] <= 57:
            if mant == 0 and buf[k] == 48:
                exp10 -= 1
            elif digits < 19:
                mant = mant * 10 + (buf[k] - 48)
                digits += 1
                exp10 -= 1
            else:
                digits += 1
            seen += 1
            k += 1
    if seen == 0:
        c0 = buf[k] | 32 if k < stop else 0
        return 0.0, (_NOT_FINITE if c0 == 110 or c0 == 105 else _NOT_NUMBER)  # 'n' or 'i'
    if k < stop and (buf[k] == 101 or buf[k] == 69):
        k += 1
        eneg = False
        if k < stop and (buf[k] == 45 or buf[k] == 43):
            eneg = buf[k] == 45
            k += 1
        e = 0
        edigits = 0
        while k < stop and 48 <= buf[k] <= 57:
            if e < 100000:
                e = e * 10 + (buf[k] - 48)
            edigits += 1
            k += 1
        if edigits == 0:
            return 0.0, _NOT_NUMBER
        exp10 += -e if eneg else e
    if k != stop:
        return 0.0, _NOT_NUMBER
    if mant == 0:
        x = 0.0
    elif digits <= 15 and -_MAX_EXACT_POW10 <= exp10 <= _MAX_EXACT_POW10:
        # both operands are exact, so one IEEE operation rounds correctly
        x = mant * powers[exp10] if exp10 >= 0 else mant / powers[-exp10]
    else:
        return 0.0, _SLOW
    return (-x if neg else x), _OK


@numba.njit(cache=True, nogil=True)
def _parse_table(buf, ncols, limits, ints, values, slow_at):  # pragma: no cover - compiled
    """Parse whitespace-separated rows of ``ncols`` fields; the last field is a float when ``values`` is given.

    Integer fields go to ``ints[:, c]`` and must lie in ``1 .. limits[c]`` (no limit where ``limits[c] <= 0``); an
    index beyond its limit is left in ``ints[rows, c]`` for the message.
    A float that the exact fast path cannot convert is left to Python: its byte offsets go to ``slow_at``.
    Returns (rows, slow count, error code, error line, error column); blank lines are skipped.
    """
    n = buf.size
    pos = 0
    row = 0
    line = 0
    nslow = 0
    float_last = values.size > 0
    nint = ncols - 1 if float_last else ncols
    powers = np.empty(_MAX_EXACT_POW10 + 1, dtype=np.float64)
    p = 1.0
    for k in range(_MAX_EXACT_POW10 + 1):
        powers[k] = p
        p *= 10.0
    while pos < n:
        line += 1
        # find the end of this line
        end = pos
        while end < n and buf[end] != 10:
            end += 1
        col = 0
        i = pos
        while True:
            while i < end and _is_blank(buf[i]):
                i += 1
            if i >= end:
                break
            if col >= ncols:
                return row, nslow, _MANY, line, col + 1
            start = i
            while i < end and not _is_blank(buf[i]):
                i += 1
            if col < nint:
                v, code = _parse_index(buf, start, i, limits[col])
                if code != _OK:
                    ints[row, col] = v  # what an index beyond its limit was, for the message
                    return row, nslow, code, line, col + 1
                ints[row, col] = v
            else:
                x, code = _parse_float(buf, start, i, powers)
                if code == _SLOW:
                    slow_at[nslow, 0] = row
                    slow_at[nslow, 1] = start
                    slow_at[nslow, 2] = i
                    nslow += 1
                elif code != _OK:
                    return row, nslow, code, line, col + 1
                values[row] = x
            col += 1
        if col == 0:
            pos = end + 1
            continue  # blank line
        if col < ncols:
            return row, nslow, _FEW, line, col
        row += 1
        pos = end + 1
    return row, nslow, _OK, line, 0


@dataclass(frozen=True)
class Table:
    """The parsed content of one file: integer columns (1-based as written) and, optionally, values."""

    ints: np.ndarray
    values: np.ndarray | None


def parse_table(
    data: bytes | np.ndarray,
    source: str,
    int_columns: int,
    with_values: bool,
    limits: tuple[int, ...] | None = None,
    beyond: tuple[str, ...] | None = None,
) -> Table:
    """Parse a tab-separated table of positive integers, optionally followed by one float column.

    Parameters
    ----------
    data
        The raw (decompressed) bytes of the file.
    source
        The file's name, used in error messages.
    int_columns
        How many leading integer columns each line has.
    with_values
        Whether each line ends with a float column.
    limits
        Largest allowed value of each integer column (``0`` for none).
    beyond
        What an index beyond its limit means, per integer column: a template of ``{value}`` and ``{limit}``
        (e.g. ``"pixel {value} is beyond the network's {limit} neurons"``); by default the column's number.

    Raises
    ------
    DasknnError
        Naming ``source`` and the first bad line.
    """
    buf = np.frombuffer(data, dtype=np.uint8) if isinstance(data, (bytes, bytearray, memoryview)) else data
    nlines = int(np.count_nonzero(buf == 10)) + 1
    ncols = int_columns + (1 if with_values else 0)
    lim = np.zeros(int_columns, dtype=np.int64) if limits is None else np.asarray(limits, dtype=np.int64)
    ints = np.empty((nlines, int_columns), dtype=np.int64)
    values = np.empty(nlines if with_values else 0, dtype=np.float64)
    slow_at = np.empty((nlines if with_values else 0, 3), dtype=np.int64)
    rows, nslow, code, line, col = _parse_table(buf, ncols, lim, ints, values, slow_at)
    if code != _OK:
        limit = int(lim[col - 1]) if 0 < col <= lim.size else 0
        value = int(ints[rows, col - 1]) if code == _BIG_INDEX else 0
        template = beyond[col - 1] if code == _BIG_INDEX and beyond is not None else _MESSAGES[code]
        raise DasknnError(template.format(ncols=ncols, col=col, limit=limit, value=value), source, line)
    for r, a, b in slow_at[:nslow]:
        # the fast pass checked the grammar, so float() cannot fail; it can overflow to inf (1e999)
        values[r] = float(bytes(buf[a:b]).decode("ascii"))
        if not np.isfinite(values[r]):
            line = int(np.count_nonzero(buf[:a] == 10)) + 1
            raise DasknnError(_MESSAGES[_NOT_FINITE].format(col=ncols), source, line)
    if rows == 0:
        raise DasknnError("the file is empty", source)
    return Table(ints=ints[:rows], values=values[:rows] if with_values else None)


def _local_file(path: str | os.PathLike[str]) -> Path:
    # behind a URL dasknn reads and writes stores only: a URL that reached here names no store
    if is_url(path):
        raise DasknnError("no such store (behind a URL dasknn reads stores; GraphChallenge files from local paths)",
                          path)
    return Path(path)


def read_bytes(path: str | os.PathLike[str]) -> bytes:
    """Read a file whole, decompressing ``.gz``; a missing, unreadable or truncated file is a DasknnError."""
    path = _local_file(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise DasknnError("no such file or directory", path) from None
    except IsADirectoryError:
        raise DasknnError("is a directory, expected a file", path) from None
    except OSError as e:
        raise DasknnError(f"cannot read: {e.strerror}", path) from None
    if raw[:2] == b"\x1f\x8b":
        try:
            return gzip.decompress(raw)
        except (EOFError, OSError, zlib.error) as e:
            raise DasknnError(f"corrupt or truncated gzip ({e})", path) from None
    if path.name.endswith(".gz"):
        raise DasknnError("not a gzip file (its first bytes are damaged, or it was never compressed)", path)
    return raw


def _coo_to_csc(table: Table, shape: tuple[int, int], source: str, dtype: np.dtype | None) -> sp.csc_matrix:
    rows = table.ints[:, 0] - 1
    cols = table.ints[:, 1] - 1
    order = np.lexsort((rows, cols))
    rows, cols = rows[order], cols[order]
    same = (rows[1:] == rows[:-1]) & (cols[1:] == cols[:-1])
    if same.any():
        k = int(np.flatnonzero(same)[0])
        first, second = sorted((int(order[k]), int(order[k + 1])))
        raise DasknnError(f"entry ({rows[k] + 1}, {cols[k] + 1}) appears twice, first on line {first + 1}", source)
    values = table.values[order]
    if dtype is not None:
        values = values.astype(dtype)
    indptr = np.zeros(shape[1] + 1, dtype=np.int64)
    np.cumsum(np.bincount(cols, minlength=shape[1]), out=indptr[1:])
    return sp.csc_matrix((values, rows.astype(np.int32), indptr), shape=shape)


def read_layer(
    data: bytes | str | os.PathLike[str], neurons: int, source: str | None = None, dtype: np.dtype | None = None
) -> sp.csc_matrix:
    """Read one ``n{N}-l{k}.tsv`` layer into a CSC matrix ``W`` (rows are inputs, columns outputs).

    Parameters
    ----------
    data
        A path, or the file's bytes (then give ``source`` for messages).
    neurons
        ``N``: indices must lie in ``1 .. N``.
    dtype
        The values' dtype; float64 keeps what the file says.
    """
    if not isinstance(data, (bytes, bytearray)):
        source = source or os.fspath(data)
        data = read_bytes(data)
    source = source or "<layer>"
    table = parse_table(data, source, 2, True, (neurons, neurons), _LAYER_BEYOND)
    return _coo_to_csc(table, (neurons, neurons), source, dtype)


def _layer_number(name: str) -> tuple[int, int] | None:
    m = LAYER_NAME.search(name.replace(os.sep, "/"))
    return (int(m.group(1)), int(m.group(2))) if m else None


def _check_layer_set(found: dict[int, str], widths: set[int], where: str, layers: int | None) -> list[int]:
    if not found:
        raise DasknnError("no layer files named n{N}-l{k}.tsv found", where)
    if len(widths) > 1:
        raise DasknnError(f"layer files of different widths ({', '.join(map(str, sorted(widths)))}) mixed", where)
    numbers = sorted(found)
    if numbers[0] < 1:
        raise DasknnError(f"unexpected layer file {found[numbers[0]]}: layers are numbered from 1", where)
    wanted = numbers[-1] if layers is None else layers
    missing = sorted(set(range(1, wanted + 1)) - set(numbers))
    if missing:
        (n,) = widths
        raise DasknnError(f"layer file n{n}-l{missing[0]}.tsv is missing ({len(missing)} of {wanted} missing)", where)
    return list(range(1, wanted + 1))


def iter_network_layers(
    path: str | os.PathLike[str], layers: int | None = None, dtype: np.dtype | None = None
) -> tuple[int, int, Iterator[sp.csc_matrix]]:
    """Find a network's layer files and return ``(neurons, depth, iterator of layers)``.

    ``path`` is a directory of ``n{N}-l{k}.tsv`` files (searched one level down too, as the tarball unpacks) or
    a ``neuron{N}.tar.gz``. The iterator parses one layer at a time, so a network larger than memory can be
    streamed into a store. ``layers`` reads only the first layers.
    """
    path = _local_file(path)
    if not path.exists():
        raise DasknnError("no such file or directory", path)
    if path.is_dir():
        files = {}
        widths = set()
        for f in sorted(list(path.glob("n*-l*.tsv")) + list(path.glob("*/n*-l*.tsv"))):
            parsed = _layer_number(f.name)
            if parsed is None:
                continue
            n, k = parsed
            if k in files and files[k] != f:
                raise DasknnError(f"layer {k} is given twice ({files[k]} and {f})", path)
            widths.add(n)
            files[k] = f
        numbers = _check_layer_set({k: str(f) for k, f in files.items()}, widths, str(path), layers)
        (neurons,) = widths

        def from_dir() -> Iterator[sp.csc_matrix]:
            for k in numbers:
                yield read_layer(files[k], neurons, dtype=dtype)

        return neurons, len(numbers), from_dir()
    if path.name.endswith((".tar.gz", ".tgz", ".tar")):
        return _iter_tar_layers(path, layers, dtype)
    raise DasknnError("expected a directory of n{N}-l{k}.tsv files, a neuron{N}.tar.gz or a .zarr store", path)


def _iter_tar_layers(
    path: Path, layers: int | None, dtype: np.dtype | None
) -> tuple[int, int, Iterator[sp.csc_matrix]]:
    # A tar.gz is read in member order, which need not be layer order: read the index first (cheap), then
    # parse members in layer order, holding at most the raw bytes of layers that arrive early.
    try:
        with tarfile.open(path, "r:*") as tar:
            members = tar.getmembers()
            # tarfile stops at the end-of-archive blocks, before gzip's trailer: read on to the end of the stream
            # so gzip checks its CRC (the index pass has already decompressed all the rest, so this is cheap)
            while tar.fileobj.read(1 << 20):
                pass
    except (tarfile.TarError, EOFError, OSError, zlib.error) as e:
        raise DasknnError(f"corrupt or truncated archive ({e})", path) from None
    found: dict[int, str] = {}
    widths = set()
    for m in members:
        parsed = _layer_number(m.name) if m.isfile() else None
        if parsed is None:
            continue
        n, k = parsed
        if k in found:
            raise DasknnError(f"layer {k} is given twice ({found[k]} and {m.name})", path)
        widths.add(n)
        found[k] = m.name
    numbers = _check_layer_set(found, widths, str(path), layers)
    (neurons,) = widths

    def from_tar() -> Iterator[sp.csc_matrix]:
        wanted = {found[k]: k for k in numbers}
        early: dict[int, bytes] = {}
        nxt = numbers[0] if numbers else None
        try:
            with tarfile.open(path, "r:*") as tar:
                for m in tar:
                    k = wanted.get(m.name)
                    if k is None:
                        continue
                    f = tar.extractfile(m)
                    early[k] = f.read() if f is not None else b""
                    while nxt is not None and nxt in early:
                        yield read_layer(early.pop(nxt), neurons, source=f"{path}:{found[nxt]}", dtype=dtype)
                        nxt = nxt + 1 if nxt < numbers[-1] else None
                    if nxt is None:
                        return
        except (tarfile.TarError, EOFError, OSError, zlib.error) as e:
            raise DasknnError(f"corrupt or truncated archive ({e})", path) from None
        if nxt is not None:
            raise DasknnError(f"archive ended before layer {nxt}", path)

    return neurons, len(numbers), from_tar()


def read_network(
    path: str | os.PathLike[str],
    layers: int | None = None,
    bias: float | None = None,
    ymax: float = 32.0,
    dtype: np.dtype | None = None,
) -> Network:
    """Read a whole GraphChallenge network (directory or ``.tar.gz``) into memory.

    Parameters
    ----------
    path
        A directory of ``n{N}-l{k}.tsv`` files or a ``neuron{N}.tar.gz``.
    layers
        Read only the first ``layers`` layers (all by default).
    bias
        The layer bias; the challenge's value for ``N`` by default.
    ymax
        The activation clamp.
    dtype
        The weights' dtype (float64 by default, as written).
    """
    neurons, depth, it = iter_network_layers(path, layers, dtype)
    b = challenge_bias(neurons) if bias is None else float(bias)
    return Network(layers=list(it), bias=b, ymax=ymax, source=os.fspath(path))


def read_images(path: str | os.PathLike[str], neurons: int | None = None, images: int | None = None,
                any_name: bool = False) -> sp.csr_matrix:
    """Read ``sparse-images-{N}.tsv[.gz]`` into an ``images x N`` CSR matrix (rows are images).

    ``neurons`` (the network's width) defaults to the ``N`` in the file name; given, a name that says another
    width is refused (a 1024-wide batch against a 4096-wide network ran to 0 categories), unless ``any_name``.
    ``images`` defaults to the largest image index.
    """
    name = Path(path).name
    pixel_beyond = _PIXEL_BEYOND
    if neurons is not None:
        check_name(path, "images", neurons, any_name=any_name)
    if neurons is None:
        m = IMAGES_NAME.search(name)
        if m is None:
            raise DasknnError("cannot tell the number of neurons from the name; expected sparse-images-{N}.tsv", path)
        neurons = int(m.group(1))
        pixel_beyond = _PIXEL_BEYOND_NAME
    table = parse_table(read_bytes(path), os.fspath(path), 2, True, (images or 0, neurons),
                        (_IMAGE_BEYOND, pixel_beyond))
    rows = table.ints[:, 0] - 1
    cols = table.ints[:, 1] - 1
    count = int(rows.max()) + 1 if images is None else images
    m = sp.csr_matrix((table.values, (rows, cols)), shape=(count, neurons))
    if m.nnz != rows.size:
        raise DasknnError("an (image, pixel) pair is given twice", path)
    m.sort_indices()
    return m


def read_categories(path: str | os.PathLike[str], images: int | None = None) -> np.ndarray:
    """Read a ``neuron{N}-l{L}-categories.tsv`` truth file into sorted 0-based image indices."""
    data = read_bytes(path)
    if not data.strip():
        return np.empty(0, dtype=np.int64)  # a network may legitimately leave no image alive
    table = parse_table(data, os.fspath(path), 1, False, (images or 0,), (_IMAGE_BEYOND,))
    idx = table.ints[:, 0] - 1
    out = np.unique(idx)
    if out.size != idx.size:
        raise DasknnError("an image index is listed twice", path)
    return out


#: The option of the command line that reads a file whatever its name says (see :func:`check_name`).
ANY_NAME_OPTION = "--any-name"


def check_name(path: str | os.PathLike[str], what: str, neurons: int, layers: int | None = None,
               any_name: bool = False) -> None:
    """Refuse, in one line, a GraphChallenge file whose name says another network than ``neurons`` x ``layers``:
    ``sparse-images-{N}`` another width, ``neuron{N}-l{L}-categories`` another width or depth.

    ``what`` names the file's kind in the message ("images", "a truth"); ``any_name`` (the user's word that the
    file is right whatever its name says: ``--any-name``) skips the check. A name of another pattern says nothing.
    """
    if any_name:
        return
    name = Path(path).name
    truth = CATEGORIES_NAME.search(name)
    if truth is not None and layers is not None and (int(truth.group(1)), int(truth.group(2))) != (neurons, layers):
        raise DasknnError(f"its name says {truth.group(1)} neurons x {truth.group(2)} layers, but the network has "
                          f"{neurons} neurons x {layers} layers: {what} for another network", path)
    images = IMAGES_NAME.search(name)
    if images is not None and int(images.group(1)) != neurons:
        raise DasknnError(f"its name says {images.group(1)} neurons, but the network has {neurons}: {what} for "
                          f"another network ({ANY_NAME_OPTION} reads it anyway)", path)


def narrow_images(path: str | os.PathLike[str], images: sp.csr_matrix) -> str | None:
    """A one-line warning where no image of ``images`` (read from ``path`` for a network as wide as its columns)
    has a nonzero beyond the first quarter of the network's width: images made for a narrower network, by the
    look of it (they run, and may end with no category at all). None where some image reaches further."""
    neurons = images.shape[1]
    if images.nnz and int(images.indices.max()) >= neurons // 4:
        return None
    return (f"{os.fspath(path)}: no image has a nonzero beyond the first {neurons // 4} of the network's {neurons} "
            f"neurons: images for a narrower network?")


def checked_truth(
    truth: np.ndarray | str | os.PathLike[str], images: int | None, neurons: int, layers: int,
    any_name: bool = False,
) -> np.ndarray:
    """The expected categories of a batch, refused in one line where they cannot be its network's and batch's.

    Called before any inference runs, so a truth for another network costs nothing (it used to cost a whole run
    and end as thousands of images that differ).

    Parameters
    ----------
    truth
        A ``neuron{N}-l{L}-categories.tsv`` file (1-based image indices), or an array of 0-based indices.
    images
        The number of images of the batch as stored or given (before ``--batch`` takes the first ones); ``None``
        where it is not known.
    neurons, layers
        The network's width and depth, which a file's name must not contradict (:func:`check_name`).
    any_name
        Read the file whatever its name says.

    Returns
    -------
    numpy.ndarray
        Sorted 0-based image indices.

    Raises
    ------
    DasknnError
        A file named for another width or depth, or an index beyond the batch's images.
    """
    if not isinstance(truth, (str, os.PathLike)):
        indices = np.unique(np.asarray(truth, dtype=np.int64))
        if indices.size and images is not None and (indices[0] < 0 or indices[-1] >= images):
            bad = indices[0] if indices[0] < 0 else indices[-1]
            raise DasknnError(f"truth: image index {bad} (0-based) is not one of the batch's {images} images")
        return indices
    check_name(truth, "a truth", neurons, layers, any_name)
    return read_categories(truth, images)


# --- writers -------------------------------------------------------------------------------------------------


def _format_values(values: np.ndarray) -> list[str]:
    # The published files write "%.6e"; use it where it reads back exactly, else the shortest exact form.
    uniq, inverse = np.unique(values, return_inverse=True)
    text = []
    for v in uniq.astype(np.float64):  # compare in float64: a float32 0.1 is not 0.1
        s = f"{v:.6e}"
        text.append(s if float(s) == v else repr(float(v)))
    return [text[i] for i in inverse]


def _write_lines(path: Path, lines: Iterable[str]) -> None:
    tmp = new_partial(path)
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(tmp, "wt", newline="\n") as f:
            f.writelines(lines)
        os.replace(tmp, path)
    except OSError as e:  # no such folder, a folder in the way, a full disk: nothing is left behind
        raise DasknnError(f"cannot write: {e.strerror or e}", path) from None
    finally:
        if tmp.exists():
            tmp.unlink()


def write_layer(path: str | os.PathLike[str], w: sp.spmatrix | sp.sparray) -> None:
    """Write one layer as ``row<TAB>col<TAB>value`` (1-based), in column-major order, atomically."""
    m = as_csc_layer(w)
    rows = (m.indices + 1).tolist()
    cols = np.repeat(np.arange(1, m.shape[1] + 1), np.diff(m.indptr)).tolist()
    vals = _format_values(m.data)
    _write_lines(Path(path), map("{}\t{}\t{}\n".format, rows, cols, vals))


def write_network(layers: Iterable[sp.spmatrix], directory: str | os.PathLike[str], neurons: int) -> Path:
    """Write layers as ``directory/neuron{N}/n{N}-l{k}.tsv`` (the published layout); return that folder."""
    folder = Path(directory) / f"neuron{neurons}"
    folder.mkdir(parents=True, exist_ok=True)
    for k, w in enumerate(layers, start=1):
        write_layer(folder / f"n{neurons}-l{k}.tsv", w)
    return folder


def write_images(path: str | os.PathLike[str], images: sp.spmatrix | sp.sparray) -> None:
    """Write an ``images x N`` matrix as ``image<TAB>pixel<TAB>value`` (1-based, ``.gz`` compresses)."""
    m = sp.csr_matrix(images)
    m.sort_indices()
    rows = np.repeat(np.arange(1, m.shape[0] + 1), np.diff(m.indptr)).tolist()
    cols = (m.indices + 1).tolist()
    vals = _format_values(m.data)
    if all(v == "1.000000e+00" for v in set(vals)):
        vals = ["1"] * len(cols)  # the published inputs write binary pixels as 1
    _write_lines(Path(path), map("{}\t{}\t{}\n".format, rows, cols, vals))


def write_categories(path: str | os.PathLike[str], categories: np.ndarray) -> None:
    """Write 0-based image indices as the 1-based truth file."""
    _write_lines(Path(path), (f"{i + 1}\n" for i in np.sort(np.asarray(categories))))
