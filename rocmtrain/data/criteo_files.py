"""Criteo file formats: raw TSV/CSV rows and TorchRec's ``day_<X>_*.npy``, read into
:class:`CriteoRows` (used by :mod:`rocmtrain.data.criteo`, which documents the formats).

    rows = read_criteo_text(Path("train.txt"))          # or a folder, .gz, CSV with header
    rows = read_criteo_npy(Path("npy/"), days=[0], mmap=True)
    dense, sparse, labels = rows.gather(np.arange(8))   # [8, 13] f32, [8, 26] i64, [8] f32
"""

from __future__ import annotations

import dataclasses
import gzip
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from torchrec.datasets.criteo import CAT_FEATURE_COUNT, INT_FEATURE_COUNT

from rocmtrain.config.data import DataConfigError

NUM_COLUMNS = 1 + INT_FEATURE_COUNT + CAT_FEATURE_COUNT
TEXT_SUFFIXES = (".tsv", ".txt", ".csv", ".gz")
_DAY_RE = re.compile(r"^day_(\d+)_dense\.npy$")


@dataclass
class CriteoRows:
    """Criteo rows in one or more parts (files/days), addressed by global row number."""

    dense: list[np.ndarray]
    """Per part: float32 ``[N_p, 13]``, already transformed."""
    sparse: list[np.ndarray]
    """Per part: integer ``[N_p, 26]`` raw categorical ids (not yet taken modulo table rows)."""
    labels: list[np.ndarray]
    """Per part: ``[N_p]`` or ``[N_p, 1]`` labels in {0, 1}."""
    files: list[str] = dataclasses.field(default_factory=list)
    """Per part: the file its sparse ids came from (for error messages)."""
    hashed: bool = True
    """The ids are raw Criteo ids, taken ``% rows[f]``; else they must lie in ``[0, rows[f])``."""

    def __post_init__(self) -> None:
        self.starts = np.cumsum([0] + [len(d) for d in self.dense])

    def locate(self, row: int) -> tuple[str, int]:
        """The file and the row within it of global row ``row``."""
        part = int(np.searchsorted(self.starts, row, side="right") - 1)
        file = self.files[part] if part < len(self.files) else "?"
        return file, row - int(self.starts[part])

    def __len__(self) -> int:
        return int(self.starts[-1])

    def gather(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Dense ``[B, 13]``, sparse ``[B, 26]`` int64, labels ``[B]`` of global ``rows``."""
        part = np.searchsorted(self.starts, rows, side="right") - 1
        dense = np.empty((len(rows), INT_FEATURE_COUNT), dtype=np.float32)
        sparse = np.empty((len(rows), CAT_FEATURE_COUNT), dtype=np.int64)
        labels = np.empty(len(rows), dtype=np.float32)
        for p in np.unique(part):
            mask = part == p
            local = rows[mask] - self.starts[p]
            dense[mask] = self.dense[p][local]
            sparse[mask] = self.sparse[p][local]
            labels[mask] = self.labels[p][local].reshape(-1)
        return dense, sparse, labels


# ---- raw text --------------------------------------------------------------------------------
def text_files(path: Path) -> list[Path]:
    """``path`` itself, or the Criteo text files of a folder in name order."""
    if path.is_file():
        return [path]
    files = sorted(
        p
        for p in path.iterdir()
        if p.is_file()
        and not p.name.startswith(".")
        and (p.suffix in TEXT_SUFFIXES or re.fullmatch(r"day_\d+", p.name))
    )
    if not files:
        raise DataConfigError(
            f"data.path={str(path)!r} is invalid: the folder has no Criteo text files "
            f"({', '.join(TEXT_SUFFIXES)} or day_<N>); point data.path at a file or such a folder"
        )
    return files


def _open_text(path: Path):
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8", newline="")
    return open(path, encoding="utf-8", newline="")


def read_criteo_text(
    path: Path, *, file_format: str = "auto", max_rows: int | None = None, field: str = "path"
) -> CriteoRows:
    """Parse raw Criteo TSV/CSV rows (one file or a folder) into memory.

    Files are streamed in chunks of ``CHUNK_ROWS`` lines and parsed with vectorised numpy
    (dense floats and hex ids), so memory is the parsed arrays (~260 bytes a row) plus a chunk.

    Raises:
        DataConfigError: naming the file and line of a malformed row.
    """
    dense, sparse, labels, files = [], [], [], []
    remaining = max_rows
    for file in text_files(path):
        with _open_text(file) as fh:
            first = fh.readline().rstrip("\r\n")
            has_header = first.startswith("label")
            fmt = file_format
            if fmt == "auto":
                fmt = "csv" if has_header or ("\t" not in first and "," in first) else "tsv"
            delimiter = "," if fmt == "csv" else "\t"
            head = [] if has_header or not first.strip() else [(1, first)]
            for chunk in _line_chunks(head, fh, limit=remaining):
                d, s, lab = _parse_lines(chunk, delimiter, file=file, field=field)
                dense.append(d)
                sparse.append(s)
                labels.append(lab)
                files.append(str(file))
                if remaining is not None:
                    remaining -= len(chunk)
        if remaining == 0:
            break
    if not dense:
        raise DataConfigError(
            f"data.{field}={str(path)!r} is invalid: no data rows found; point it at Criteo rows"
        )
    return CriteoRows(dense, sparse, labels, files=files, hashed=True)


CHUNK_ROWS = 1 << 16


def _line_chunks(head: list[tuple[int, str]], fh, *, limit: int | None):
    """Non-blank ``(line number, text)`` lists of up to ``CHUNK_ROWS``, at most ``limit`` in all."""
    chunk, total = list(head), len(head)
    for number, line in enumerate(fh, start=2):
        if limit is not None and total >= limit:
            break
        line = line.rstrip("\r\n")
        if not line.strip():
            continue
        chunk.append((number, line))
        total += 1
        if len(chunk) == CHUNK_ROWS:
            yield chunk
            chunk = []
    if limit is not None:
        chunk = chunk[: max(0, limit - (total - len(chunk)))]
    if chunk:
        yield chunk


def _parse_lines(
    lines: list[tuple[int, str]], delimiter: str, *, file: Path, field: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    cells = [text.split(delimiter) for _, text in lines]
    for (number, _), row in zip(lines, cells, strict=True):
        if len(row) != NUM_COLUMNS:
            hint = (
                " (39 columns: a Criteo test file without labels cannot train)"
                if len(row) == NUM_COLUMNS - 1
                else ""
            )
            sep = "tab" if delimiter == "\t" else "comma"
            raise DataConfigError(
                f"data.{field}: {file}:{number} has {len(row)} {sep}-separated columns, "
                f"expected {NUM_COLUMNS} (label, I1-I13, C1-C26){hint}; check data.file_format "
                f"(tsv|csv) and the file"
            )
    table = np.array(cells, dtype=str)
    try:
        head = table[:, : 1 + INT_FEATURE_COUNT]
        numeric = np.where(head == "", "0", head).astype(np.float64)
    except ValueError as err:
        raise DataConfigError(
            f"data.{field}: {file} has a non-numeric label or I1-I13 value ({err}); "
            f"check the file is raw Criteo data"
        ) from err
    label = numeric[:, 0]
    bad = np.flatnonzero((label != 0) & (label != 1))
    if bad.size:
        raise DataConfigError(
            f"data.{field}: {file}:{lines[int(bad[0])][0]} has label {label[bad[0]]:g}; "
            f"Criteo labels are 0 or 1"
        )
    dense = np.log1p(np.maximum(numeric[:, 1:], 0.0)).astype(np.float32)
    line_numbers = [number for number, _ in lines]
    sparse = parse_hex(
        table[:, 1 + INT_FEATURE_COUNT :], file=file, field=field, lines=line_numbers
    )
    return dense, sparse, label.astype(np.float32)


_HEX_VALUE = np.full(128, -1, dtype=np.int64)
for _i, _c in enumerate("0123456789abcdef"):
    _HEX_VALUE[ord(_c)] = _HEX_VALUE[ord(_c.upper())] = _i


def parse_hex(
    cells: np.ndarray,
    *,
    file: Path | str = "",
    field: str = "path",
    lines: list[int] | None = None,
) -> np.ndarray:
    """``int(c, 16)`` of every cell of a unicode ``[rows, C1..C26]`` array (empty -> 0),
    vectorised; int64. ``lines``: the file's line number of each row (for errors)."""
    width = cells.dtype.itemsize // 4
    if width == 0:
        return np.zeros(cells.shape, dtype=np.int64)
    codes = np.ascontiguousarray(cells).view(np.uint32).reshape(*cells.shape, width)
    lengths = (codes != 0).sum(axis=-1)
    position = np.arange(width)
    used = position < lengths[..., None]
    digits = _HEX_VALUE[np.minimum(codes, 127)]
    bad = (used & ((digits < 0) | (codes > 127))).any(axis=-1) | (lengths > 15)
    if bad.any():
        where = np.unravel_index(int(np.flatnonzero(bad)[0]), bad.shape)
        raise DataConfigError(
            f"data.{field}: {file}{_cell_name(where, lines)} has categorical value "
            f"{cells[where]!r}, not a hex id of at most 15 digits (ids are never negative); "
            f"C1-C26 must be hex ids or empty"
        )
    exponent = np.clip(lengths[..., None] - 1 - position, 0, None)
    return np.where(used, digits << (4 * exponent), 0).sum(axis=-1)


def _cell_name(where: tuple, lines: list[int] | None) -> str:
    """``:LINE feature C<k>`` of a cell of a 2-d categorical table (``""`` for other shapes)."""
    if len(where) != 2:
        return ""
    row, column = (int(i) for i in where)
    line = f":{lines[row]}" if lines is not None else ""
    return f"{line} feature C{column + 1}"


# ---- TorchRec .npy ---------------------------------------------------------------------------
def npy_days(path: Path, days: list[int] | None, *, field: str = "path") -> list[int]:
    """The ``day_<X>`` numbers to read from ``path`` (given, or all found)."""
    if not path.is_dir():
        raise DataConfigError(
            f"data.{field}={str(path)!r} is invalid: criteo_npy reads a folder of "
            f"day_<X>_{{dense,sparse,labels}}.npy files; point data.{field} at that folder"
        )
    found = sorted(int(m.group(1)) for p in path.iterdir() if (m := _DAY_RE.match(p.name)))
    chosen = found if days is None else [int(d) for d in days]
    if not chosen:
        raise DataConfigError(
            f"data.{field}={str(path)!r} is invalid: no day_<X>_dense.npy files there; create "
            f"them with torchrec's npy_preproc_criteo.py (BinaryCriteoUtils.tsv_to_npys)"
        )
    return chosen


def read_criteo_npy(
    path: Path,
    *,
    days: list[int] | None,
    mmap: bool,
    max_rows: int | None = None,
    field: str = "path",
    raw_ids: bool = False,
) -> CriteoRows:
    """Open TorchRec's ``day_<X>_{dense,sparse,labels}.npy`` files (memory-mapped by default).

    ``raw_ids``: the sparse ids are raw Criteo ids (taken ``% rows`` later), else table rows.
    Ids are checked per batch as they are read (a full scan of a memory-mapped day would read
    it all at start-up).
    """
    dense, sparse, labels, sources = [], [], [], []
    remaining = max_rows
    for day in npy_days(path, days, field=field):
        files = [path / f"day_{day}_{kind}.npy" for kind in ("dense", "sparse", "labels")]
        for file in files:
            if not file.is_file():
                raise DataConfigError(
                    f"data.{field}={str(path)!r} is invalid: {file.name} is missing; every day "
                    f"needs dense, sparse and labels files (or select days with data.days)"
                )
        d, s, lab = (_load_npy(file, mmap=mmap, field=field) for file in files)
        n = len(d)
        expected = {"dense": (n, INT_FEATURE_COUNT), "sparse": (n, CAT_FEATURE_COUNT)}
        for kind, arr in (("dense", d), ("sparse", s)):
            if arr.shape != expected[kind]:
                raise DataConfigError(
                    f"data.{field}: day_{day}_{kind}.npy has shape {arr.shape}, expected "
                    f"{expected[kind]}; write the files with torchrec's BinaryCriteoUtils"
                )
        if lab.shape not in ((n,), (n, 1)):
            raise DataConfigError(
                f"data.{field}: day_{day}_labels.npy has shape {lab.shape}, expected ({n}, 1)"
            )
        if remaining is not None:
            d, s, lab = d[:remaining], s[:remaining], lab[:remaining]
            remaining -= len(d)
        dense.append(d)
        sparse.append(s)
        labels.append(lab)
        sources.append(str(files[1]))
        if remaining == 0:
            break
    return CriteoRows(dense, sparse, labels, files=sources, hashed=raw_ids)


def _load_npy(file: Path, *, mmap: bool, field: str) -> np.ndarray:
    try:
        return np.load(file, mmap_mode="r" if mmap else None)
    except (OSError, ValueError, EOFError) as err:
        raise DataConfigError(
            f"data.{field}: {file} is not a readable .npy array ({err}); rewrite it with "
            f"torchrec's BinaryCriteoUtils.tsv_to_npys"
        ) from err
