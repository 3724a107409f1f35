"""Data schema: which data a run reads and how it is batched and sharded.

Set from YAML (``configs/data/<kind>.yaml``) or the command line, e.g.::

    python -m rocmtrain data=criteo_tsv data.path=/data/criteo/day_0 data.batch_size=4096

Values are checked once, when :func:`rocmtrain.data.build_datamodule` builds the data
(:meth:`DataConfig.validate`), so composing or dry-running a recipe never needs the data files.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from rocmtrain.config import ConfigError

DATA_KINDS = ("synthetic", "criteo_tsv", "criteo_npy", "criteo_multihot")
GENERATE_ON = ("auto", "device", "cpu")
FILE_FORMATS = ("auto", "tsv", "csv")
NPY_IDS = ("contiguous", "raw")


class DataConfigError(ConfigError):
    """A ``data.*`` value or data file is unusable; the message names the field or file, the value
    and the fix."""


@dataclass
class DataConfig:
    """Data source, per-rank batching, sharding and the synthetic planted signal."""

    kind: str = "synthetic"
    """``"synthetic"`` (generated, planted learnable signal), ``"criteo_tsv"`` (raw Criteo rows:
    tab-separated Kaggle/1TB layout or CSV with a ``label,I1..,C1..`` header) , ``"criteo_npy"``
    (TorchRec's preprocessed ``day_X_{dense,sparse,labels}.npy``) or ``"criteo_multihot"``
    (MLPerf's multi-hot ``day_X_dense.npy``, ``day_X_labels.npy``,
    ``day_X_sparse_multi_hot.npz``)."""

    path: str | None = None
    """Criteo kinds: the training data. ``criteo_tsv``: one file or a folder of ``*.tsv``,
    ``*.txt``, ``*.csv`` files (read in name order). ``criteo_npy``: a folder holding
    ``day_<X>_dense.npy``, ``day_<X>_sparse.npy``, ``day_<X>_labels.npy``. ``criteo_multihot``:
    a folder holding ``day_<X>_dense.npy``, ``day_<X>_labels.npy``,
    ``day_<X>_sparse_multi_hot.npz``. Unused by synthetic."""

    val_path: str | None = None
    """Optional separate validation data (same layout as ``path``; ``criteo_multihot``: every
    day found there). When unset, the last ``val_fraction`` of the rows of ``path`` (in file order)
    is held out for validation; ``criteo_multihot``: the first half of the last of ``days``."""

    days: list[int] | None = None
    """``criteo_npy``, ``criteo_multihot``: which ``day_<X>`` files to read from ``path``;
    ``None`` = every day found, in numeric order."""

    file_format: str = "auto"
    """``criteo_tsv`` only: ``"tsv"`` (no header, tab-separated), ``"csv"`` (comma-separated,
    header line ``label,I1,...,C26``) or ``"auto"`` (a first line starting with ``label`` means CSV)."""

    max_rows: int | None = None
    """Criteo kinds: read at most this many rows of ``path`` (``None`` = all)."""

    val_fraction: float = 0.1
    """``criteo_tsv``/``criteo_npy`` without ``val_path``: fraction of rows (the last ones) used
    for validation, in ``[0, 1)``; 0 disables validation."""

    npy_ids: str = "contiguous"
    """``criteo_npy`` only: what the integer ids of ``day_<X>_sparse.npy`` are. ``"contiguous"``:
    row numbers of the tables, each in ``[0, rows[f])``; any other id is an error naming the file,
    feature and value. ``"raw"``: raw Criteo ids as torchrec's ``BinaryCriteoUtils.tsv_to_npys``
    writes them (``int(hex, 16)``), taken ``% rows[f]`` as TorchRec's ``hashes`` and the TSV reader
    do; a negative id is an error there too (no hex id is negative)."""

    mmap: bool = True
    """``criteo_npy``, ``criteo_multihot``: memory-map the files instead of loading them into
    memory."""

    shuffle_window_rows: int = 1 << 22
    """``criteo_multihot`` only: the training order is shuffled within windows of this many rows
    (the windows themselves in a shuffled order), so reads stay in one window at a time and no
    permutation of the whole split is held (``rocmtrain/data/criteo_multihot.py``)."""

    batch_size: int = 512
    """Samples per batch PER RANK (global batch = ``batch_size * world_size``)."""

    num_train_batches: int = 100
    """Synthetic only: training batches per rank per epoch."""

    num_val_batches: int = 10
    """Synthetic only: validation batches per rank."""

    shuffle: bool = True
    """Reshuffle the training order every epoch (seeded: the same on every rank and on resume)."""

    drop_last: bool = True
    """Criteo kinds: drop the training rows that do not fill a whole batch on every rank. When
    false they are spread over the ranks (last batches differ by at most one row between ranks).
    Validation never drops rows."""

    num_workers: int | None = None
    """DataLoader worker processes per rank. ``None`` (auto): 0 when the run trains on the CPU or
    generates synthetic batches on the GPU; otherwise the host's cores shared among the ranks of
    the node, one left for the training process, at most 8 (:func:`auto_num_workers`). 0 = load
    in the training process."""

    read_threads: int | None = None
    """``criteo_multihot`` only: threads of the training process that read each batch's rows
    from the memory maps into host buffers (pinned on a GPU run), several batches ahead; the
    files' int32 ids are widened to int64 and taken ``% rows`` on the training device after the
    copy (``rocmtrain/data/multihot_reader.py``). ``None`` (auto): on a GPU run without loader
    processes (``num_workers`` null or 0), as many threads as :func:`auto_num_workers` would
    give processes, at most 4 (more compete with the training thread); 0 on CPU runs. 0 = build batches as the other kinds do (in the process or in
    ``num_workers`` loader processes). A count >= 1 reads with threads on any device (a CPU run
    finishes the batches on the host)."""

    pin_memory: bool | None = None
    """Pin host batches for faster host-to-GPU copies. ``None`` (auto): pinned when the run trains
    on a GPU and the batches are made on the host."""

    generate_on: str = "auto"
    """Synthetic only: where batches are generated. ``"auto"``: on the training device (a GPU run
    makes its batches on the GPU, a few compiled kernels and well under a millisecond for
    65,536 MLPerf-sized samples, no host work and no copy) unless ``num_workers`` asks for
    loader processes; ``"device"``: on the training device always; ``"cpu"``: on the host (in ``num_workers`` processes, if any).
    Every choice draws each batch from its own seed, so any batch can be rebuilt on resume; the
    same seed gives other samples on a GPU than on the CPU (different random number engines)."""

    seed: int | None = None
    """Data seed (synthetic data, shuffling). ``None`` = the run's ``seed``."""

    resample_each_epoch: bool = True
    """Synthetic only: draw new training samples every epoch (an endless stream, no memorising;
    batches are generated as they are needed). False: the same ``num_train_batches`` batches
    every epoch, reshuffled, pre-generated in memory."""

    cache_batches: int = 0
    """Synthetic only, for GPU throughput runs: pre-generate this many distinct training batches
    per rank once (deterministic, the planted signal intact) and cycle them for the epoch's
    ``num_train_batches`` (batch ``i`` of an epoch is cached batch ``i % cache_batches``, or of
    its shuffled order). Takes generation (~0.5 s per 65,536 x 214-id batch on one core) off the
    training loop. With ``pin_memory=true`` the cached batches are pinned once (on CUDA/ROCm
    builds with a GPU). 0 = generate every batch when it is needed (the default)."""

    signal_strength: float = 1.0
    """Synthetic only: scale of the hidden logit (0 = labels are pure noise at ``base_ctr``;
    1 gives a Bayes-optimal AUC of about 0.9)."""

    num_signal_dense: int = 3
    """Synthetic only: how many dense features drive the hidden logit."""

    num_signal_sparse: int = 4
    """Synthetic only: how many categorical features drive the hidden logit (through a hidden
    +/-1 effect per id, averaged over the multi-hot ids of a sample)."""

    zipf_exponent: float = 1.05
    """Synthetic only: id popularity follows a power law ``P(id) ~ (id+1)^-exponent`` over each
    table (0 = uniform). Popular ids recur, so their hidden effect is learnable."""

    base_ctr: float = 0.25
    """Synthetic only: mean click rate (the hidden bias is calibrated to it; Criteo's is ~0.25)."""

    def __post_init__(self) -> None:
        self.validate_values()

    def ids_in_range(self, table_rows: list[int]) -> bool:
        """Whether every sparse id these data hand the model is a row of its table by
        construction (``model.embedding_bounds_check=auto`` then skips the kernel's check):
        the synthetic generator draws ids in ``[0, rows)``; ``criteo_tsv`` takes them ``% rows``;
        ``criteo_npy`` checks every batch on the host (a bad id stops the run naming its file
        and row) or takes raw ids ``% rows``; ``criteo_multihot`` takes them ``% rows`` where a
        table has fewer than 2**31 - 1 rows (larger tables get the file's int32 ids as they are)."""
        if self.kind == "criteo_multihot":
            return max(table_rows, default=0) < 2**31 - 1
        return self.kind in ("synthetic", "criteo_tsv", "criteo_npy")

    def validate(self) -> None:
        """Check values and files; raise :class:`DataConfigError` naming field, value and fix."""
        self.validate_values()
        self.validate_files()

    def validate_values(self) -> None:
        """The values alone (at construction): a config may name files that exist only where
        the run starts, so :meth:`validate_files` runs when the data are built."""
        if self.kind not in DATA_KINDS:
            _fail("kind", self.kind, f"choose one of {', '.join(DATA_KINDS)}")
        positive = {"batch_size": self.batch_size}
        if self.kind == "synthetic":
            positive |= {
                "num_train_batches": self.num_train_batches,
                "num_val_batches": self.num_val_batches,
            }
        for name, value in positive.items():
            if not isinstance(value, int) or value < 1:
                _fail(name, value, "use a positive integer")
        if not isinstance(self.cache_batches, int) or self.cache_batches < 0:
            _fail("cache_batches", self.cache_batches, "use 0 (off) or a positive batch count")
        if self.cache_batches and self.kind != "synthetic":
            _fail("cache_batches", self.cache_batches, "only synthetic data is cached; set 0")
        if self.num_workers is not None and (
            not isinstance(self.num_workers, int) or self.num_workers < 0
        ):
            _fail("num_workers", self.num_workers, "use 0 (main process), a count or null (auto)")
        if self.read_threads is not None:
            if not isinstance(self.read_threads, int) or self.read_threads < 0:
                _fail("read_threads", self.read_threads, "use 0 (off), a count or null (auto)")
            if self.read_threads and self.kind != "criteo_multihot":
                _fail(
                    "read_threads",
                    self.read_threads,
                    "reader threads read data.kind=criteo_multihot only; set null",
                )
            if self.read_threads and self.num_workers:
                _fail(
                    "read_threads",
                    self.read_threads,
                    f"threads read batches in the training process but data.num_workers="
                    f"{self.num_workers} asks for loader processes: set data.num_workers=0 (or "
                    "null), or data.read_threads=0 to build batches in the processes",
                )
        if self.generate_on not in GENERATE_ON:
            _fail("generate_on", self.generate_on, f"choose one of {', '.join(GENERATE_ON)}")
        if self.generate_on == "device" and self.num_workers:
            _fail(
                "num_workers",
                self.num_workers,
                "data.generate_on=device makes batches in the training process: set "
                "data.num_workers=0 (or null), or data.generate_on=cpu to generate in workers",
            )
        if not 0.0 <= self.val_fraction < 1.0:
            _fail("val_fraction", self.val_fraction, "use a fraction in [0, 1), e.g. 0.1")
        if self.max_rows is not None and self.max_rows < 1:
            _fail("max_rows", self.max_rows, "use a positive row count or null for all rows")
        if self.file_format not in FILE_FORMATS:
            _fail("file_format", self.file_format, f"choose one of {', '.join(FILE_FORMATS)}")
        if not isinstance(self.shuffle_window_rows, int) or self.shuffle_window_rows < 1:
            _fail("shuffle_window_rows", self.shuffle_window_rows, "use a positive row count")
        if self.npy_ids not in NPY_IDS:
            _fail("npy_ids", self.npy_ids, f"choose one of {', '.join(NPY_IDS)}")
        if self.signal_strength < 0:
            _fail("signal_strength", self.signal_strength, "use a value >= 0 (1.0 is the default)")
        if not 0.0 < self.base_ctr < 1.0:
            _fail("base_ctr", self.base_ctr, "use a click rate strictly between 0 and 1")
        if self.zipf_exponent < 0:
            _fail("zipf_exponent", self.zipf_exponent, "use 0 (uniform) or a positive exponent")
        for name in ("num_signal_dense", "num_signal_sparse"):
            if getattr(self, name) < 0:
                _fail(name, getattr(self, name), "use 0 or a positive count")
        if self.kind != "synthetic":
            self._validate_paths()

    def _validate_paths(self) -> None:
        if not self.path:
            _fail(
                "path",
                self.path,
                f"data.kind={self.kind} reads files: set data.path=/path/to/criteo "
                "(or use data=synthetic)",
            )

    def validate_files(self) -> None:
        """The files named exist (when the data are built)."""
        for name in ("path", "val_path"):
            value = getattr(self, name)
            if value is not None and not Path(value).expanduser().exists():
                _fail(
                    name,
                    value,
                    f"no such file or folder; point data.{name} at existing Criteo data "
                    "(or use data=synthetic)",
                )


def auto_num_workers(ranks_on_node: int, cpu_count: int | None = None) -> int:
    """Loader processes per rank when ``data.num_workers`` is unset on a GPU run: the node's cores
    shared among its ranks, one per rank left for the training process itself, at most 8 (more
    only adds start-up time and memory: one process builds a batch in well under a GPU step)."""
    cores = cpu_count if cpu_count is not None else (os.cpu_count() or 1)
    return max(1, min(8, cores // max(1, ranks_on_node) - 1))


def _fail(field: str, value: object, fix: str) -> None:
    raise DataConfigError(f"data.{field}={value!r} is invalid: {fix}")
