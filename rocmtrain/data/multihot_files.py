"""MLPerf's multi-hot Criteo files, opened as memory-maps and checked before training.

Per day ``N`` of a folder (the layout of mlcommons/training ``recommendation_v2/torchrec_dlrm``)::

    day_N_dense.npy               float32 [rows, 13]
    day_N_labels.npy              [rows, 1] (or [rows]) 0/1, any int/float/bool dtype
    day_N_sparse_multi_hot.npz    an UNCOMPRESSED zip of 0.npy .. 25.npy, int32 [rows, L[f]]

``np.load`` cannot memory-map an ``.npz`` member, but a stored (uncompressed) member is its
``.npy`` bytes verbatim inside the zip: the member's data start = its local header's offset
(``zipfile``) + the 30-byte local header + its name and extra field + the ``.npy`` header
(``numpy.lib.format``). :class:`NpyRef` records that offset and memory-maps it on first use.

Every problem is a :class:`DataConfigError` of one line naming the file, the array and the fix.
"""

from __future__ import annotations

import re
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rocmtrain.config.data import DataConfigError

SPARSE_SUFFIX = "_sparse_multi_hot.npz"
_DAY_RE = re.compile(r"^day_(\d+)" + re.escape(SPARSE_SUFFIX) + "$")
_MEMBER_RE = re.compile(r"^(\d+)\.npy$")
#: zip local file header (APPNOTE 4.3.7): signature ... file name length, extra field length
_LOCAL_HEADER = struct.Struct("<4s5H3L2H")
_LOCAL_SIGNATURE = b"PK\x03\x04"
_WRITER = "python -m rocmtrain write-data"


@dataclass(frozen=True)
class NpyRef:
    """An ``.npy`` array stored at a byte ``offset`` of ``file`` (a ``.npy`` file or a zip)."""

    file: str
    label: str
    """How messages name it: ``day_0_dense.npy`` or ``day_0_sparse_multi_hot.npz member 3.npy``."""
    offset: int
    """Byte offset of the array's data (after the ``.npy`` header) in ``file``."""
    dtype: np.dtype
    shape: tuple[int, ...]
    fortran: bool

    @property
    def rows(self) -> int:
        return int(self.shape[0]) if self.shape else 0

    def open(self, *, mmap: bool) -> np.ndarray:
        """The array, memory-mapped read-only (or read into memory with ``mmap=False``)."""
        order = "F" if self.fortran else "C"
        if self.rows == 0:
            return np.empty(self.shape, dtype=self.dtype, order=order)
        arr = np.memmap(
            self.file, dtype=self.dtype, mode="r", offset=self.offset, shape=self.shape, order=order
        )
        return arr if mmap else np.array(arr)


@dataclass(frozen=True)
class MultiHotDay:
    """The three files of one day, checked against each other."""

    day: int
    dense: NpyRef
    labels: NpyRef
    sparse: tuple[NpyRef, ...]
    """One per feature: int32 ``[rows, L[f]]``."""

    @property
    def rows(self) -> int:
        return self.dense.rows

    @property
    def hot_sizes(self) -> list[int]:
        return [int(m.shape[1]) for m in self.sparse]


def _name(file: Path, label: str) -> str:
    return f"{file} {label}" if label else str(file)


def _fail(field: str, message: str) -> DataConfigError:
    return DataConfigError(f"data.{field}: {message}")


def read_npy_header(fh, *, file: Path, label: str, field: str) -> tuple[tuple, bool, np.dtype]:
    """``(shape, fortran_order, dtype)`` of the ``.npy`` header at ``fh``'s position."""
    try:
        version = np.lib.format.read_magic(fh)
        if version == (1, 0):
            return np.lib.format.read_array_header_1_0(fh)
        if version == (2, 0):
            return np.lib.format.read_array_header_2_0(fh)
        raise ValueError(f".npy format version {version} holds no plain numeric array")
    except (ValueError, OSError, EOFError) as err:
        raise _fail(
            field,
            f"{_name(file, label)} is not a readable .npy array ({err}); rewrite it with "
            "numpy.save "
            f"or {_WRITER}",
        ) from None


def _ref(fh, *, file: Path, label: str, field: str, end: int) -> NpyRef:
    """Read the ``.npy`` header at ``fh``'s position; the data must end by byte ``end``."""
    shape, fortran, dtype = read_npy_header(fh, file=file, label=label, field=field)
    offset = fh.tell()
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if offset + nbytes > end:
        raise _fail(
            field,
            f"{_name(file, label)} is truncated: its header says {dtype} {list(shape)} "
            f"({nbytes} bytes) but only {max(end - offset, 0)} bytes follow; copy or write the "
            "file again",
        )
    return NpyRef(str(file), label, offset, dtype, tuple(int(s) for s in shape), bool(fortran))


def open_npy(file: Path, *, field: str) -> NpyRef:
    """Check a plain ``.npy`` file's header and size; its data are mapped later."""
    with open(file, "rb") as fh:
        return _ref(fh, file=file, label="", field=field, end=file.stat().st_size)


def npz_members(file: Path, *, field: str) -> dict[int, NpyRef]:
    """The ``<k>.npy`` members of an uncompressed ``.npz``, by ``k``, with their data offsets."""
    try:
        zf = zipfile.ZipFile(file)
    except (zipfile.BadZipFile, OSError) as err:
        raise _fail(
            field,
            f"{file} is not a readable zip archive ({err}): truncated, or not an .npz; copy or "
            f"write it again (numpy.savez, or {_WRITER})",
        ) from None
    members: dict[int, NpyRef] = {}
    size = file.stat().st_size
    with zf, open(file, "rb") as fh:
        for info in zf.infolist():
            match = _MEMBER_RE.match(info.filename)
            if match is None:
                continue
            label = f"member {info.filename}"
            if info.compress_type != zipfile.ZIP_STORED:
                raise _fail(
                    field,
                    f"{file} {label} is compressed; the layout is memory-mapped and needs an "
                    "uncompressed .npz: write it with numpy.savez (not savez_compressed)",
                )
            fh.seek(info.header_offset)
            head = fh.read(_LOCAL_HEADER.size)
            if len(head) < _LOCAL_HEADER.size or head[:4] != _LOCAL_SIGNATURE:
                raise _fail(field, f"{file} {label} has no zip local header; write the file again")
            *_, name_len, extra_len = _LOCAL_HEADER.unpack(head)
            start = info.header_offset + _LOCAL_HEADER.size + name_len + extra_len
            fh.seek(start)
            end = min(start + info.file_size, size)
            members[int(match.group(1))] = _ref(fh, file=file, label=label, field=field, end=end)
    return members


def multihot_days(path: Path, days: list[int] | None, *, field: str) -> list[int]:
    """The day numbers to read from ``path``: ``days`` (each must exist) or all found."""
    if not path.is_dir():
        raise _fail(
            field,
            f"{path} is not a folder; criteo_multihot reads a folder of day_<N>_dense.npy, "
            f"day_<N>_labels.npy and day_<N>{SPARSE_SUFFIX} files",
        )
    found = sorted(int(m.group(1)) for p in path.iterdir() if (m := _DAY_RE.match(p.name)))
    if days is None:
        if not found:
            raise _fail(
                field,
                f"{path} has no day_<N>{SPARSE_SUFFIX} files; point data.{field} at MLPerf's "
                f"multi-hot folder or write one with {_WRITER}",
            )
        return found
    missing = [int(d) for d in days if int(d) not in found]
    if missing:
        have = ", ".join(map(str, found)) or "none"
        raise _fail(
            field,
            f"day {missing[0]} does not exist: {path}/day_{missing[0]}{SPARSE_SUFFIX} is missing "
            f"(days there: {have}); choose data.days among them",
        )
    return [int(d) for d in days]


def open_day(path: Path, day: int, *, field: str, num_dense: int) -> MultiHotDay:
    """Open and check one day: dtypes, shapes and that the three files have the same rows."""
    names = {
        "dense": f"day_{day}_dense.npy",
        "labels": f"day_{day}_labels.npy",
        "sparse": f"day_{day}{SPARSE_SUFFIX}",
    }
    for name in names.values():
        if not (path / name).is_file():
            raise _fail(
                field,
                f"{path / name} is missing; every day needs {', '.join(names.values())}",
            )
    dense = open_npy(path / names["dense"], field=field)
    if dense.dtype != np.float32 or len(dense.shape) != 2 or dense.shape[1] != num_dense:
        raise _fail(
            field,
            f"{dense.file} is {dense.dtype} {list(dense.shape)}, expected float32 [rows, "
            f"{num_dense}] (model.num_dense_features={num_dense}); write it as float32 with "
            f"{num_dense} columns",
        )
    labels = open_npy(path / names["labels"], field=field)
    if labels.dtype.kind not in "biuf" or labels.shape not in ((dense.rows,), (dense.rows, 1)):
        raise _fail(
            field,
            f"{labels.file} is {labels.dtype} {list(labels.shape)}, expected 0/1 labels "
            f"[{dense.rows}, 1], one per row of {names['dense']}; write the three files of a day "
            "from the same rows",
        )
    members = npz_members(path / names["sparse"], field=field)
    sparse_file = path / names["sparse"]
    count = len(members)
    gap = next((k for k in range(count + 1) if k not in members), count)
    if gap < count or count == 0:
        raise _fail(
            field,
            f"{sparse_file} has no member {gap}.npy (members are 0.npy .. <F-1>.npy, one per "
            "feature); write the file again with every feature",
        )
    sparse = tuple(members[k] for k in range(count))
    for ref in sparse:
        if ref.dtype != np.int32 or len(ref.shape) != 2 or ref.shape[1] < 1:
            raise _fail(
                field,
                f"{sparse_file} {ref.label} is {ref.dtype} {list(ref.shape)}, expected int32 "
                "[rows, hot size]; convert the ids with .astype(np.int32) (ids below 2**31) or "
                f"write the day with {_WRITER}",
            )
        if ref.rows != dense.rows:
            raise _fail(
                field,
                f"{sparse_file} {ref.label} has {ref.rows} rows but {names['dense']} has "
                f"{dense.rows}; the three files of a day must hold the same rows",
            )
    return MultiHotDay(day, dense, labels, sparse)


def check_features(
    days: list[MultiHotDay], *, table_rows: list[int], hot_sizes: list[int] | None, field: str
) -> list[int]:
    """The files' hot sizes, checked against the model's tables and ``model.multi_hot_sizes``."""
    first = days[0]
    sizes = first.hot_sizes
    sparse_file = Path(first.sparse[0].file)
    if len(sizes) != len(table_rows):
        raise _fail(
            field,
            f"{sparse_file} holds {len(sizes)} features (0.npy .. {len(sizes) - 1}.npy) but the "
            f"model has {len(table_rows)} tables (model.num_embeddings_per_feature); give the "
            f"model {len(sizes)} tables",
        )
    if hot_sizes is not None and list(hot_sizes) != sizes:
        f = next(i for i, (a, b) in enumerate(zip(hot_sizes, sizes, strict=True)) if a != b)
        raise _fail(
            field,
            f"{sparse_file} member {f}.npy has {sizes[f]} ids per row but "
            f"model.multi_hot_sizes[{f}]={hot_sizes[f]}; set model.multi_hot_sizes={sizes} "
            "or null (then the files' sizes are used)",
        )
    for day in days[1:]:
        if day.hot_sizes != sizes:
            raise _fail(
                field,
                f"{day.sparse[0].file} has hot sizes {day.hot_sizes} but day {first.day} has "
                f"{sizes}; every day needs the same features and hot sizes",
            )
    return sizes
