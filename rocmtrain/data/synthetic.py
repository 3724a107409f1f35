"""Synthetic Criteo-shaped data with a planted, learnable click signal.

Every sample has ``D`` dense features, ``F`` categorical features with ``L[f]`` ids each (ids
drawn from a power law over each table, so popular ids recur), and a label drawn from::

    z        ~ N(0, 1)^D                      dense_features = softplus(z)   (>= 0, like log counts)
    logit    = s * ( sum_j w_j z_j                              (num_signal_dense features)
                   + 0.9 * sum_f mean_l effect(f, id[f][l]) )   (num_signal_sparse features)
               + bias                                           (mean click rate = base_ctr)
    w_j      = +/-1 on num_signal_dense random features, 0 elsewhere
    effect   = +/-1, a hidden hash bit of (seed, f, id)
    label    ~ Bernoulli(sigmoid(logit))

With ``s = signal_strength = 1`` the Bayes-optimal AUC is about 0.9; a small DLRM learns the
dense part within tens of steps and the popular ids soon after.

Data are made in blocks of one batch: block ``g`` of a split is generated from
``seed(data_seed, split, g)`` only, and rank ``r`` of ``W`` owns blocks ``r, r+W, r+2W, ...``.
So shards are disjoint, the union over ranks does not depend on who generates what, and any
batch can be rebuilt on resume without replaying the ones before it.

Training data: with ``resample_each_epoch`` (default) epoch ``e`` draws new blocks seeded with
``(data_seed, split, g, e)`` (an endless click stream: a model cannot memorise the training set);
otherwise the same ``num_train_batches`` blocks come back every epoch in a seeded new order,
kept in memory once made when they fit in ``CACHE_LIMIT_BYTES``. Validation blocks are fixed.
With ``data.cache_batches=N`` (GPU throughput runs) the training split is ``N`` distinct blocks
generated once and cycled (batch ``i`` of an epoch is block ``order(i) % N``), pinned once with
``pin_memory``. Generation is vectorised: ~1-5 ms for 256 x 26 ids on one core. A GPU run
generates on the GPU by default (``data.generate_on``), where an MLPerf-sized batch (65,536 x 214
ids) is a fraction of a millisecond of device work instead of ~0.5 s of one host core; the same
code runs there, seeded by a generator on the device, with what is made from the draws compiled
into a few fused kernels (``PlantedSignal.generate``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torchrec.datasets.utils import Batch

from rocmtrain.config.data import DataConfig
from rocmtrain.data.batch import concat_rows, generator, make_batch_from_values
from rocmtrain.data.loader import RowLayout

CACHE_LIMIT_BYTES = 1 << 30
SPLIT_CODES = {"train": 1, "val": 2}
_HASH_PRIME = 2_147_483_647  # 2^31 - 1


class PlantedSignal:
    """The hidden model that labels synthetic samples (shared by all ranks: depends on seed only)."""

    def __init__(
        self,
        *,
        num_embeddings_per_feature: Sequence[int],
        multi_hot_sizes: Sequence[int],
        num_dense: int,
        seed: int,
        signal_strength: float,
        num_signal_dense: int,
        num_signal_sparse: int,
        zipf_exponent: float,
        base_ctr: float,
    ) -> None:
        self.rows = [int(n) for n in num_embeddings_per_feature]
        self.multi_hot = [int(m) for m in multi_hot_sizes]
        self.num_dense = num_dense
        self.seed = seed
        self.strength = signal_strength
        self.zipf_exponent = zipf_exponent
        gen = generator(seed, 0)
        k_dense = min(num_signal_dense, num_dense)
        k_sparse = min(num_signal_sparse, len(self.rows))
        # dense weights: +/-1 on k_dense random features, norm ~ sqrt(k) ~ 1.7 for k=3
        self.dense_weight = torch.zeros(num_dense, dtype=torch.float64)
        chosen = torch.randperm(num_dense, generator=gen)[:k_dense]
        signs = torch.randint(0, 2, (k_dense,), generator=gen) * 2 - 1
        self.dense_weight[chosen] = signs.double()
        # sparse features with signal; each contributes +/- c_f * (mean effect of its ids)
        self.signal_features = sorted(
            torch.randperm(len(self.rows), generator=gen)[:k_sparse].tolist()
        )
        self.sparse_weight = 0.9
        self.hash_mult = [
            int(torch.randint(1, 1 << 20, (1,), generator=gen)) * 2 + 1 for _ in self.rows
        ]
        # table rows of every id column (feature f repeated L[f] times), for vectorised sampling
        self._column_rows = torch.tensor(
            [float(n) for n, m in zip(self.rows, self.multi_hot, strict=True) for _ in range(m)],
            dtype=torch.float64,
        )
        self._column_max = self._column_rows.to(torch.int64) - 1
        self._column_top = torch.pow(self._column_rows + 1.0, 1.0 - zipf_exponent)
        self._by_device: dict[torch.device, tuple[torch.Tensor, ...]] = {
            torch.device("cpu"): (
                self._column_rows, self._column_top, self._column_max, self.dense_weight
            )
        }  # fmt: skip
        self._compiled = None
        self.bias = 0.0
        self.bias = self._calibrate_bias(base_ctr, generator(seed, 3))

    def _calibrate_bias(self, base_ctr: float, gen: torch.Generator) -> float:
        """Bias so that the mean click rate is ``base_ctr`` (bisection on 16k samples)."""
        z, u = self._draws(16384, gen)
        logit = self._unbiased_logit(z, self._ids(u).split(self.multi_hot, dim=1))
        lo, hi = -30.0, 30.0
        for _ in range(60):
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if torch.sigmoid(logit + mid).mean() < base_ctr else (lo, mid)
        return 0.5 * (lo + hi)

    def id_effect(self, feature: int, ids: torch.Tensor) -> torch.Tensor:
        """Hidden +/-1 effect of each id of ``feature`` (a hash bit; no table of size rows[f])."""
        h = (
            (ids % _HASH_PRIME) * self.hash_mult[feature] + feature * 7919 + self.seed
        ) % _HASH_PRIME
        return ((h >> 11) & 1).to(torch.float64) * 2.0 - 1.0

    def sample_ids(self, shape: tuple[int, int], gen: torch.Generator) -> list[torch.Tensor]:
        """Ids of every feature, ``[B, L[f]]`` each, in ``[0, rows[f])`` with
        ``P(id) ~ (id + 1) ** -zipf_exponent`` (0: uniform); one vectorised draw for all columns."""
        u = self._uniform(shape[0], gen)
        return list(self._ids(u).split(self.multi_hot, dim=1))

    def _uniform(self, batch_size: int, gen: torch.Generator) -> torch.Tensor:
        """The uniform draws behind ``batch_size`` samples' ids, ``[B, sum(L)]`` fp64."""
        n = self._constants(gen.device)[0].numel()
        return torch.rand(batch_size, n, generator=gen, dtype=torch.float64, device=gen.device)

    def _ids(self, u: torch.Tensor) -> torch.Tensor:
        """Ids ``[B, sum(L)]`` (feature f in its ``L[f]`` columns) from uniform draws ``u``."""
        n, top, largest, _ = self._constants(u.device)
        a = self.zipf_exponent
        if a == 0.0:
            x = 1.0 + u * n
        elif abs(a - 1.0) < 1e-9:
            x = torch.pow(n + 1.0, u)
        else:  # inverse CDF of a continuous power law on [1, n + 1); top = (n + 1) ** (1 - a)
            x = torch.pow(1.0 + u * (top - 1.0), 1.0 / (1.0 - a))
        # x >= 1, so the integer cast is floor (and much cheaper than Tensor.floor on CPU)
        return torch.minimum((x.to(torch.int64) - 1).clamp(min=0), largest)

    def _constants(self, device: torch.device) -> tuple[torch.Tensor, ...]:
        """(column rows, column top, column max id, dense weight) on ``device``, copied once."""
        found = self._by_device.get(device)
        if found is None:
            host = (self._column_rows, self._column_top, self._column_max, self.dense_weight)
            found = self._by_device[device] = tuple(t.to(device) for t in host)
        return found

    def _draws(self, batch_size: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """The random draws of ``batch_size`` samples, in order: the dense features' normals
        ``z`` ``[B, D]`` and the ids' uniforms ``[B, sum(L)]`` (:meth:`_uniform`), both fp64."""
        z = torch.randn(
            batch_size, self.num_dense, generator=gen, dtype=torch.float64, device=gen.device
        )
        return z, self._uniform(batch_size, gen)

    def _unbiased_logit(self, z: torch.Tensor, ids: Sequence[torch.Tensor]) -> torch.Tensor:
        logit = z @ self._constants(z.device)[3]
        for f in self.signal_features:
            logit = logit + self.sparse_weight * self.id_effect(f, ids[f]).mean(dim=1)
        return self.strength * logit

    def generate(self, batch_size: int, gen: torch.Generator) -> Batch:
        """One batch of ``batch_size`` samples from ``gen``.

        The draws are eager (``torch.Generator`` streams); what is made from them (ids, their
        key-major KJT values, the hidden logit, the dense features) is one function of the
        draws, compiled on a GPU (:meth:`_fused`): eagerly it is ~20 passes over ``[B, sum(L)]``
        fp64/int64 tensors and ~30 launches a batch, a few percent of a DLRM-DCNv2 step on one
        GPU; compiled, a few fused kernels with the same arithmetic.
        """
        z, u = self._draws(batch_size, gen)
        values, logit, dense = self._fused(gen.device)(u, z)
        labels = torch.bernoulli(torch.sigmoid(logit), generator=gen)
        return make_batch_from_values(dense, values, self.multi_hot, labels)

    def _made_from_draws(
        self, u: torch.Tensor, z: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(key-major id values, biased hidden logit, float32 dense features) from the draws."""
        ids = self._ids(u).split(self.multi_hot, dim=1)
        values = torch.cat([t.reshape(-1) for t in ids])
        logit = self._unbiased_logit(z, ids) + self.bias
        return values, logit, torch.nn.functional.softplus(z.float())

    def _fused(self, device: torch.device):
        """:meth:`_made_from_draws`, compiled where batches are made on a GPU (static shapes:
        one compile per batch size); eager on the CPU, where compiling would cost more than the
        batches of a CPU run."""
        if device.type == "cpu":
            return self._made_from_draws
        if self._compiled is None:
            self._compiled = torch.compile(self._made_from_draws, dynamic=False)
        return self._compiled

    def logit(self, batch: Batch) -> torch.Tensor:
        """The hidden logit of a generated batch (fp64), recomputed from its features."""
        z = torch.log(torch.expm1(batch.dense_features.double()))  # inverse softplus
        kjt = batch.sparse_features.to_dict()
        ids = [kjt[f"cat_{f}"].values().reshape(-1, m) for f, m in enumerate(self.multi_hot)]
        return self._unbiased_logit(z, ids) + self.bias


class SyntheticSource:
    """This rank's synthetic batches of one split (a :class:`~rocmtrain.data.loader.BatchSource`)."""

    def __init__(
        self,
        signal: PlantedSignal,
        *,
        split: str,
        batch_size: int,
        num_batches: int,
        rank: int,
        world_size: int,
        shuffle: bool,
        resample_each_epoch: bool = False,
        cache_batches: int = 0,
        pin_memory: bool = False,
        device: torch.device | str = "cpu",
    ) -> None:
        self.signal = signal
        self.device = torch.device(device)
        self.resample = resample_each_epoch
        self.split_code = SPLIT_CODES[split]
        self.batch_size = batch_size
        self.num_batches = num_batches
        self.rank = rank
        self.world_size = world_size
        self.shuffle = shuffle
        ids_per_sample = sum(signal.multi_hot)
        bytes_per_batch = batch_size * (8 * ids_per_sample + 4 * (signal.num_dense + 2))
        self._perm: tuple[int, torch.Tensor] | None = None
        self._cycle: list[Batch] | None = None
        if cache_batches:  # a fixed set of distinct batches, cycled (GPU throughput runs)
            self._cycle = [self.block(b) for b in range(min(cache_batches, num_batches))]
            if pin_memory and self.device.type == "cpu" and torch.cuda.is_available():
                self._cycle = [b.pin_memory() for b in self._cycle]
        # the same batches every epoch: kept once made (made at first use, so building the
        # source allocates nothing on the device)
        self._keep = not self.resample and bytes_per_batch * num_batches <= CACHE_LIMIT_BYTES
        self._kept: dict[int, Batch] = {}
        # an epoch resumed from a checkpoint of another world size (see resume)
        self._resumed: tuple[int, int, list[int], RowLayout] | None = None

    def __len__(self) -> int:
        return self.num_batches

    def global_block(self, local_block: int) -> int:
        """Global block number of this rank's ``local_block``."""
        return local_block * self.world_size + self.rank

    def block(self, local_block: int, epoch: int | None = None) -> Batch:
        """Generate this rank's ``local_block`` (of ``epoch`` when resampling; deterministic)."""
        return self.global_block_batch(self.global_block(local_block), epoch)

    def global_block_batch(self, block: int, epoch: int | None = None) -> Batch:
        """Generate global ``block`` (of ``epoch`` when resampling; deterministic)."""
        parts = [self.signal.seed, self.split_code, block]
        if epoch is not None:
            parts.append(7_919 + epoch)
        gen = generator(*parts, device=self.device)
        return self.signal.generate(self.batch_size, gen)

    def _local_order(self, epoch: int, rank: int) -> torch.Tensor:
        """Rank ``rank``'s local blocks in ``epoch``'s order (the same for any world size)."""
        if not self.shuffle:
            return torch.arange(self.num_batches)
        gen = generator(self.signal.seed, self.split_code, 1_000_003 + epoch, rank)
        return torch.randperm(self.num_batches, generator=gen)

    def block_for(self, epoch: int, index: int) -> int:
        """Which local block is batch ``index`` of ``epoch`` (a seeded per-epoch permutation)."""
        if not self.shuffle:
            return index
        if self._perm is None or self._perm[0] != epoch:
            self._perm = (epoch, self._local_order(epoch, self.rank))
        return int(self._perm[1][index])

    # Resuming on another world size. An epoch begun on W ranks is W * num_batches blocks in
    # rounds (round i: the i-th batch of rank 0, of rank 1, ...); after b steps its first
    # b * W * batch_size samples are consumed, a prefix of that order. Resumed on another world
    # size, the epoch finishes the rest of *that* order (so W, not the new world size, sets its
    # size), split over the new ranks by RowLayout; the epochs after it are this world size's.
    def epoch_blocks(self, epoch: int, world_size: int) -> list[int]:
        """Global blocks of ``epoch`` begun on ``world_size`` ranks, in round order."""
        if self.resample:  # batch i of rank r is block i * W + r, drawn anew each epoch
            orders = [torch.arange(self.num_batches)] * world_size
        else:
            orders = [self._local_order(epoch, r) for r in range(world_size)]
        return [
            int(orders[r][i]) * world_size + r
            for i in range(self.num_batches)
            for r in range(world_size)
        ]

    def samples_before(self, epoch: int, batch: int) -> int:
        if self._resumed is not None and self._resumed[0] == epoch:
            return self._resumed[3].samples_before(epoch, batch)
        return min(batch, self.num_batches) * self.world_size * self.batch_size

    def resumed(self, epoch: int) -> dict[str, int | bool]:
        if self._resumed is not None and self._resumed[0] == epoch:
            return {"resumed": True, "epoch_world_size": self._resumed[1]}
        return {"resumed": False, "epoch_world_size": self.world_size}

    def resume(self, epoch: int, samples: int, state: dict) -> int:
        """Lay out the rest of ``epoch`` from global sample ``samples``; its first batch index."""
        if self._cycle is not None:  # a few batches cycled: nothing to finish, keep the count
            return min(samples // (self.world_size * self.batch_size), self.num_batches)
        began = int(state.get("epoch_world_size", state["world_size"]))
        blocks = self.epoch_blocks(epoch, began)
        layout = RowLayout(
            self.num_batches * self.world_size * self.batch_size,
            batch_size=self.batch_size, rank=self.rank, world_size=self.world_size,
            drop_last=False,
        )  # fmt: skip
        first = layout.resume(epoch, samples, num_rows=len(blocks) * self.batch_size)
        self._resumed = (epoch, began, blocks, layout)
        return first

    def _resumed_batch(self, epoch: int, index: int) -> Batch:
        """Batch ``index`` of a resumed epoch: its samples of the began epoch's block order."""
        assert self._resumed is not None
        _, _, blocks, layout = self._resumed
        lo, hi = layout.slices(epoch)[index]
        parts = []
        while lo < hi:
            block, row = divmod(lo, self.batch_size)
            take = min(hi - lo, self.batch_size - row)
            made = self.global_block_batch(blocks[block], epoch if self.resample else None)
            parts.append((made, row, row + take))
            lo += take
        return concat_rows(parts)

    def batch(self, epoch: int, index: int) -> Batch:
        if self._resumed is not None and self._resumed[0] == epoch and self._cycle is None:
            return self._resumed_batch(epoch, index)
        if self._cycle is not None:  # data.cache_batches: the same few batches over and over
            return self._cycle[self.block_for(epoch, index) % len(self._cycle)]
        if self.resample:  # new samples every epoch: nothing to memorise
            return self.block(index, epoch)
        local = self.block_for(epoch, index)
        if not self._keep:
            return self.block(local)
        if local not in self._kept:
            self._kept[local] = self.block(local)
        return self._kept[local]


def generation_device(cfg: DataConfig, train_device: torch.device) -> torch.device:
    """Where ``cfg``'s synthetic batches are made for a run training on ``train_device``."""
    if cfg.generate_on == "cpu" or train_device.type == "cpu":
        return torch.device("cpu")
    if cfg.generate_on == "auto" and cfg.num_workers:
        return torch.device("cpu")  # loader processes were asked for: they generate
    return train_device


def synthetic_factory(
    cfg: DataConfig, *, rows: list[int], multi_hot: list[int], num_dense: int, seed: int
):
    """``factory(split, rank, world_size, device)`` for
    :class:`~rocmtrain.data.datamodule.RecDataModule` (``device``: the training device)."""
    signal = PlantedSignal(
        num_embeddings_per_feature=rows,
        multi_hot_sizes=multi_hot,
        num_dense=num_dense,
        seed=seed,
        signal_strength=cfg.signal_strength,
        num_signal_dense=cfg.num_signal_dense,
        num_signal_sparse=cfg.num_signal_sparse,
        zipf_exponent=cfg.zipf_exponent,
        base_ctr=cfg.base_ctr,
    )

    def factory(
        split: str, rank: int, world_size: int, device: torch.device | None = None
    ) -> SyntheticSource:
        train = split == "train"
        return SyntheticSource(
            signal,
            split=split,
            batch_size=cfg.batch_size,
            num_batches=cfg.num_train_batches if train else cfg.num_val_batches,
            rank=rank,
            world_size=world_size,
            shuffle=cfg.shuffle and train,
            resample_each_epoch=cfg.resample_each_epoch and train,
            cache_batches=cfg.cache_batches if train else 0,
            pin_memory=bool(cfg.pin_memory),
            device=generation_device(cfg, device or torch.device("cpu")),
        )

    return factory
