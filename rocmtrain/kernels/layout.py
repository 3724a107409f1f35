"""The table-batched layout: every table in one flat weight buffer, KJT-style jagged inputs.

Shape legend: ``T`` tables, ``F`` features (a feature reads one table; several features may share
a table), ``B`` bags (samples) per feature, ``D_f`` the dim of feature ``f``, ``N`` indices.

Weights (one dtype)::

    weights  = [ table 0: rows_0 x D_0 | table 1: rows_1 x D_1 | ... ]   (flat, row-major)
    weights_offsets[t] = sum_{u<t} rows_u * D_u      row_offsets[t] = sum_{u<t} rows_u

Inputs are a KeyedJaggedTensor's ``values()`` / ``offsets()`` (key-major, ``F*B + 1`` offsets)::

    feature 0                  feature 1
    bag:     0      1   2      0   1        2
    indices [3, 7 | 5 | ]  [  1 | 4, 4, 9 | 8 ]     (bag 2 of feature 0 is empty)
    offsets [0,     2,  3,  3,    4,        7,  8]

Output ``[B, sum_f D_f]``: feature ``f`` fills columns ``D_offsets[f] : D_offsets[f+1]``.

Usage::

    layout = TBELayout.build([(1000, 16), (50, 8)], feature_table_map=[0, 1, 0])
    meta = layout.meta(torch.device("cpu"))       # small int tensors the kernels read
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import accumulate

import torch


@dataclass(frozen=True)
class FeatureMeta:
    """Per-feature int tensors on one device (what the kernels index)."""

    weights_offset: torch.Tensor  #: int64 [F] element offset of the feature's table
    rows: torch.Tensor  #: int64 [F] rows of the feature's table
    row_offset: torch.Tensor  #: int64 [F] global row id of the table's row 0
    dim: torch.Tensor  #: int32 [F] D_f
    d_offsets: torch.Tensor  #: int32 [F+1] output column offsets


@dataclass(frozen=True)
class TBELayout:
    """Where each table and feature lives; built by :meth:`build`, immutable."""

    table_rows: tuple[int, ...]
    table_dims: tuple[int, ...]
    feature_table_map: tuple[int, ...]
    weights_offsets: tuple[int, ...]  #: per table, elements; plus the total at the end
    row_offsets: tuple[int, ...]  #: per table, rows; plus the total at the end
    d_offsets: tuple[int, ...]  #: per feature output column offset; plus sum D at the end
    _meta_cache: dict = field(default_factory=dict, compare=False, repr=False, hash=False)

    @classmethod
    def build(
        cls, tables: Sequence[tuple[int, int]], *, feature_table_map: Sequence[int] | None = None
    ) -> TBELayout:
        tables = [tuple(t) for t in tables]
        if not tables:
            raise ValueError("tables is empty: pass at least one (num_embeddings, embedding_dim)")
        for t, spec in enumerate(tables):
            if len(spec) != 2 or not all(isinstance(v, int) and v > 0 for v in spec):
                raise ValueError(
                    f"tables[{t}]={spec!r} must be (num_embeddings, embedding_dim) positive ints"
                )
        fmap = list(range(len(tables))) if feature_table_map is None else list(feature_table_map)
        if not fmap:
            raise ValueError("feature_table_map is empty: every feature must name a table")
        for f, t in enumerate(fmap):
            if not (isinstance(t, int) and 0 <= t < len(tables)):
                raise ValueError(
                    f"feature_table_map[{f}]={t!r} is not a table index in [0, {len(tables)})"
                )
        rows = tuple(r for r, _ in tables)
        dims = tuple(d for _, d in tables)
        woff = tuple(accumulate((r * d for r, d in tables), initial=0))
        roff = tuple(accumulate(rows, initial=0))
        doff = tuple(accumulate((dims[t] for t in fmap), initial=0))
        return cls(rows, dims, tuple(fmap), woff, roff, doff)

    @property
    def num_tables(self) -> int:
        return len(self.table_rows)

    @property
    def num_features(self) -> int:
        return len(self.feature_table_map)

    @property
    def total_dim(self) -> int:
        """sum_f D_f: the output's column count."""
        return self.d_offsets[-1]

    @property
    def total_weights(self) -> int:
        return self.weights_offsets[-1]

    @property
    def total_rows(self) -> int:
        return self.row_offsets[-1]

    @property
    def max_dim(self) -> int:
        return max(self.table_dims)

    def feature_dims(self) -> list[int]:
        return [self.table_dims[t] for t in self.feature_table_map]

    def meta(self, device: torch.device | str) -> FeatureMeta:
        """Per-feature metadata tensors on ``device`` (cached)."""
        device = torch.device(device)
        key = str(device)
        if key not in self._meta_cache:
            fmap = self.feature_table_map

            def i64(vals: Sequence[int]) -> torch.Tensor:
                return torch.tensor(list(vals), dtype=torch.int64, device=device)

            self._meta_cache[key] = FeatureMeta(
                weights_offset=i64(self.weights_offsets[t] for t in fmap),
                rows=i64(self.table_rows[t] for t in fmap),
                row_offset=i64(self.row_offsets[t] for t in fmap),
                dim=i64(self.table_dims[t] for t in fmap).to(torch.int32),
                d_offsets=i64(self.d_offsets).to(torch.int32),
            )
        return self._meta_cache[key]

    def batch_size(self, offsets: torch.Tensor) -> int:
        """B from a KJT offsets tensor of length F*B+1; clear error when the length is wrong."""
        if offsets.dim() != 1:
            raise ValueError(f"offsets must be 1-D (KJT offsets), got shape {tuple(offsets.shape)}")
        n = offsets.numel() - 1
        F = self.num_features
        if n < 0 or n % F:
            raise ValueError(
                f"offsets has {offsets.numel()} entries; expected F*B+1 with F={F} features "
                "(key-major KJT offsets, i.e. kjt.offsets())"
            )
        return n // F
