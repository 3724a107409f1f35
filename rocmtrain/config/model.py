"""Model schema: a TorchRec DLRM (dot interaction) or DLRM-DCNv2 (``interaction: dcn``).

Field names follow TorchRec's DLRM example (``num_embeddings_per_feature``, ``embedding_dim``,
``dense_arch_layer_sizes``, ``over_arch_layer_sizes``, ...). One table per sparse feature, named
``t_<feature>`` (features are ``cat_0`` .. ``cat_{F-1}``).

    python -m rocmtrain model.embedding_dim=32 model.interaction=dcn model.dcn_num_layers=2
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rocmtrain.config import ConfigError, check_choice

INTERACTIONS = ("dot", "dcn")
POOLINGS = ("sum", "mean")
EMBEDDING_OPTIMIZERS = ("adagrad", "rowwise_adagrad", "sgd", "adam")
DENSE_OPTIMIZERS = ("adagrad", "sgd", "adam")
DENSE_OPTIMIZER_IMPLS = ("auto", "for_loop", "foreach", "fused", "compiled")
EMBEDDING_OUTPUT_DTYPES = ("fp32", "bf16", "fp16", "autocast")
EMBEDDING_WEIGHT_DTYPES = ("fp32", "fp16")
EMBEDDING_BOUNDS_CHECKS = ("auto", "on", "off")
WEIGHT_BYTES = {"fp32": 4, "fp16": 2}
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune")
# the modes in which torch.compile replays the compiled parts as CUDA graphs
GRAPHED_COMPILE_MODES = ("reduce-overhead", "max-autotune")


@dataclass
class ModelConfig:
    """DLRM architecture, embedding tables and the two optimizers (sparse fused, dense regular)."""

    num_embeddings_per_feature: list[int] = field(default_factory=lambda: [1000] * 8)
    """Rows of each embedding table, one entry per sparse feature (F = len of this list)."""
    max_rows_per_table: int | None = None
    """Cap applied to every entry of ``num_embeddings_per_feature`` ("rows scaled to fit");
    ``null`` = no cap. Ids are hashed into the capped table by the data module."""
    embedding_dim: int = 16
    """Embedding dimension D of every table (DLRM's dot interaction needs one D for all)."""
    multi_hot_sizes: list[int] | None = None
    """Ids per sample for each feature (multi-hot); ``null`` = one-hot (1 id per feature)."""
    pooling: str = "sum"
    """Pooling of a bag of ids: ``sum`` or ``mean``."""
    num_dense_features: int = 13
    """Dense (continuous) input features per sample (Criteo: 13)."""
    dense_arch_layer_sizes: list[int] = field(default_factory=lambda: [64, 16])
    """Bottom MLP layer sizes; the last one must equal ``embedding_dim``."""
    over_arch_layer_sizes: list[int] = field(default_factory=lambda: [64, 32, 1])
    """Top MLP layer sizes; the last one must be 1 (one logit)."""
    interaction: str = "dot"
    """Feature interaction: ``dot`` (DLRM) or ``dcn`` (DLRM-DCNv2 low-rank cross network)."""
    dcn_num_layers: int = 3
    """Cross layers of the DCN interaction (``interaction: dcn`` only)."""
    dcn_low_rank_dim: int = 512
    """Low-rank dimension of each DCN cross layer (``interaction: dcn`` only)."""
    compile_interaction: bool = False
    """``torch.compile`` the DCN cross network (``interaction: dcn`` only). Each cross layer's
    ``x0 * (xw + b) + xl`` is three passes over ``[B, 27*D]`` fp32 activations in eager mode (and
    more in backward): at ``B = 65536`` that is most of a DLRM-DCNv2 step on an H200. Inductor fuses
    them into one kernel per layer and direction, with the same dtypes (fp32 math and storage;
    GEMMs unchanged). Costs a one-time compile (tens of seconds) and a C++ compiler on CPU."""
    compile_dense: bool = False
    """``torch.compile`` the whole dense model in place: the bottom MLP, the interaction (the DCN
    cross net, or the dot interaction) and the top MLP, each as one static-shape graph. Beyond
    ``compile_interaction`` this fuses each MLP layer's bias/ReLU (and their backward) into fewer
    passes and lets Inductor pick the GEMM epilogues. The compiled parts are the modules inside the
    precision-policy groups (``dense_arch.model``, ``inter_arch.crossnet``, ``over_arch.model``;
    the dot interaction itself), so fp32 islands stay outside the graphs and parameter names and
    state-dict keys do not change. Includes ``compile_interaction``. The loss (BCE on ``[B]``
    logits) stays eager: it is one pass over B values. Costs a one-time compile per part."""
    compile_mode: str = "default"
    """``torch.compile`` mode of the compiled parts (``compile_dense`` / ``compile_interaction``):
    ``default``, or ``reduce-overhead``: each compiled part's forward and backward are replayed as
    CUDA graphs (PyTorch's CUDA graph trees), one launch per part instead of one per kernel. ROCm
    builds of PyTorch run them as hipGraphs (AMD's own stacks use them, e.g. the CUDA-graph guide
    of ROCm ATOM, rocm.docs.amd.com); not measured on an MI300 here. Same kernels and numbers;
    pays where the host needs about as long per step as the GPU, the case of DLRM-DCNv2 on one
    fast GPU. Costs a recording per shape and grad mode, the inputs that come from outside a graph
    (dense features, pooled embeddings) copied into its static buffers each step, and a private
    memory pool. GPU only: on a CPU the parts compile as ``default`` (a warning says so).
    ``max-autotune``: the same CUDA graphs, and Inductor also times its own Triton GEMM templates
    (with the following elementwise work fused into their epilogues) against the vendor BLAS for
    each GEMM shape and keeps the faster; the first compile takes minutes (Inductor caches the
    choices on disk, ``TORCHINDUCTOR_CACHE_DIR``; point it at shared storage for jobs that land on
    new nodes) and logs, at error level, the candidate configs that do not fit the GPU's shared
    memory, which it skips. Same dtypes; the GEMMs' summation order may differ from
    cuBLAS/hipBLASLt."""
    compile_ddp_optimizer: bool = False
    """Let Dynamo's DDP optimizer split each compiled part into one graph per DDP gradient bucket
    (``torch._dynamo.config.optimize_ddp``, ``torch.compile``'s own default for code that runs
    inside ``DistributedDataParallel``, where TorchRec puts the dense part, one GPU included).
    ``false`` (rocmtrain's default): each compiled part stays one graph. A split costs, at each
    edge, an eager sum of the gradients of the tensors the graphs share (the DCN's ``x_0``, a
    ``[B, 27*D]`` pass) and, with CUDA graphs, a copy of it into the next graph's static input;
    what it buys is an all-reduce that starts per bucket inside a part's backward instead of at
    its end, which only several GPUs can use. GPU measurements: ``scripts/bench/BENCHMARKS.md``."""
    dcn_autocast_residual: bool = False
    """DCN only: under autocast (mixed precision with ``precision.policy.interaction=autocast``),
    carry the cross net's residual stream ``x_0``, ``x_l`` in the autocast dtype (bf16) instead of
    fp32. Each cross layer ``x_0 * (W V x_l + b) + x_l`` then reads and writes half the bytes, and
    the activations saved for backward are half the size; the GEMMs are unchanged (bf16 inputs,
    fp32 accumulation). Costs bf16 rounding of the residual sum (8-bit mantissa) once per layer.
    Where the policy keeps the interaction in fp32 (autocast off inside it) this does nothing."""
    embedding_optimizer: str = "adagrad"
    """Fused (in-backward) optimizer of the embedding tables: adagrad, rowwise_adagrad, sgd, adam."""
    embedding_output_dtype: str = "fp32"
    """dtype of the pooled embeddings the embedding kernel writes (FBGEMM's and rocmtrain's TBE
    ``output_dtype``): ``fp32``, ``bf16`` or ``fp16``. The kernel sums a bag in fp32 and rounds
    the sum once; the gradient of the pooled output comes back in the same dtype (the table update
    itself is fp32). ``bf16`` halves the bytes of the ``[B, F*D]`` pooled output, of its gradient
    and of the concat into the interaction (at DLRM-DCNv2 sizes ~0.9 GB each per step); autocast
    would round them to bf16 at the first GEMM anyway, but without ``dcn_autocast_residual`` the
    cross net's fp32 ``x_0`` then holds bf16 values, and the embedding gradients carry 8 mantissa
    bits. The tables' own dtype is unchanged. ``autocast``: the run's autocast dtype where the
    interaction runs under autocast on a GPU (``precision=bf16 precision.policy.interaction=
    autocast`` -> bf16), else fp32 — so an fp32 run stays fp32 (:func:`resolve_model_config`)."""
    embedding_weight_dtype: str = "fp32"
    """dtype the embedding tables are stored in (TorchRec's ``EmbeddingBagConfig.data_type``):
    ``fp32`` or ``fp16``. The kernels read, sum and update in fp32 and round the updated rows to
    fp16 (FBGEMM stochastically, so small updates are not lost on average); the optimizer state
    (Adagrad's sums) stays fp32. Half the table memory and half the bytes of every row the lookups
    and the update read and write. (bf16 tables: FBGEMM's CPU kernels have none, so they cannot
    be tested here.) A checkpoint resumes into a run with the dtype it was written with."""
    embedding_bounds_check: str = "auto"
    """Whether the embedding kernel checks every id against its table's rows before the lookup:
    ``on`` (FBGEMM's default ``BoundsCheckMode.WARNING``: a bad id is counted, warned about and
    read as row 0; rocmtrain's kernel raises), ``off`` (``BoundsCheckMode.NONE``: no check, one
    pass over the ids and offsets less per step; an id outside its table then reads and updates
    memory that is not its row, so only for ids in range by construction), or ``auto``: ``off``
    where the run's data make every id a row of its table (``DataConfig.ids_in_range``: the
    synthetic generator draws them in range, the Criteo readers check or take them ``% rows``),
    else ``on`` (:func:`resolve_model_config`; a module built from an unresolved config checks)."""
    embedding_lr: float = 0.05
    """Learning rate of the embedding optimizer."""
    embedding_eps: float = 1e-8
    """Epsilon of the embedding optimizer (Adagrad/Adam)."""
    dense_optimizer: str = "adagrad"
    """Optimizer of the dense (MLP) parameters: adagrad, sgd, adam."""
    dense_lr: float = 0.05
    """Learning rate of the dense optimizer."""
    dense_optimizer_impl: str = "auto"
    """Implementation of the dense optimizer step (``torch.optim``'s ``foreach``/``fused`` flags;
    same update rule): ``auto`` = PyTorch's choice (``foreach`` for GPU tensors, a per-parameter
    loop on CPU); ``for_loop`` = one small kernel set per parameter; ``foreach`` = multi-tensor
    kernels over all dense parameters, one per elementwise op; ``fused`` = one multi-tensor kernel
    for the whole update. Where this PyTorch has no fused kernel for the optimizer and device
    (fused Adagrad on CUDA arrived after some 2.x releases) ``fused`` runs ``foreach`` and logs a
    warning. ``compiled`` = the ``foreach`` update compiled by ``torch.compile`` (Inductor fuses
    its kernels; a one-time compile of a few seconds, and a C++ compiler on CPU)."""
    auc_num_thresholds: int | None = None
    """Bins of the validation AUROC (torchmetrics ``thresholds``); ``null`` = exact AUC (keeps
    all predictions in memory: fine for CPU-sized validation sets, use e.g. 10000 on GPUs)."""

    @property
    def num_features(self) -> int:
        """F: the number of sparse features (= tables)."""
        return len(self.num_embeddings_per_feature)

    @property
    def compiles_anything(self) -> bool:
        """Whether ``compile_dense`` or ``compile_interaction`` compiles a part of the model."""
        return self.compile_dense or (self.compile_interaction and self.interaction == "dcn")

    @property
    def uses_cuda_graphs(self) -> bool:
        """Whether the compiled parts replay as CUDA graphs (``reduce-overhead``,
        ``max-autotune``)."""
        return self.compile_mode in GRAPHED_COMPILE_MODES and self.compiles_anything

    def pooling_factors(self) -> dict[str, float]:
        """Expected ids per sample of each table ``t_cat_<i>`` (multi-hot size, 1 for one-hot):
        the planner's cost input, known from the config alone."""
        hot = self.multi_hot_sizes or [1] * self.num_features
        return {f"t_cat_{i}": float(k) for i, k in enumerate(hot)}

    def table_rows(self) -> list[int]:
        """Rows per table after ``max_rows_per_table``."""
        cap = self.max_rows_per_table
        return [min(n, cap) if cap else n for n in self.num_embeddings_per_feature]

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise :class:`ConfigError` for an unusable value (field, value and fix named)."""
        check_choice("model.interaction", self.interaction, INTERACTIONS)
        check_choice("model.pooling", self.pooling, POOLINGS)
        check_choice("model.embedding_optimizer", self.embedding_optimizer, EMBEDDING_OPTIMIZERS)
        check_choice("model.dense_optimizer", self.dense_optimizer, DENSE_OPTIMIZERS)
        check_choice("model.dense_optimizer_impl", self.dense_optimizer_impl, DENSE_OPTIMIZER_IMPLS)
        check_choice(
            "model.embedding_output_dtype", self.embedding_output_dtype, EMBEDDING_OUTPUT_DTYPES
        )
        check_choice(
            "model.embedding_weight_dtype", self.embedding_weight_dtype, EMBEDDING_WEIGHT_DTYPES
        )
        check_choice("model.compile_mode", self.compile_mode, COMPILE_MODES)
        check_choice(
            "model.embedding_bounds_check", self.embedding_bounds_check, EMBEDDING_BOUNDS_CHECKS
        )
        if self.compile_ddp_optimizer and not self.compiles_anything:
            raise ConfigError(
                "model.compile_ddp_optimizer",
                True,
                "it splits the compiled parts: set model.compile_dense=true (or "
                "model.compile_interaction=true with model.interaction=dcn), or leave it false",
            )
        if self.compile_mode != "default" and not self.compiles_anything:
            raise ConfigError(
                "model.compile_mode",
                self.compile_mode,
                "it applies to the compiled parts: set model.compile_dense=true (or "
                "model.compile_interaction=true with model.interaction=dcn), or leave it default",
            )
        rows = self.num_embeddings_per_feature
        if not rows or any(n < 1 for n in rows):
            raise ConfigError(
                "model.num_embeddings_per_feature", rows, "give one positive row count per feature"
            )
        if self.max_rows_per_table is not None and self.max_rows_per_table < 1:
            raise ConfigError(
                "model.max_rows_per_table", self.max_rows_per_table, "use a positive cap or null"
            )
        if self.multi_hot_sizes is not None:
            if len(self.multi_hot_sizes) != self.num_features:
                raise ConfigError(
                    "model.multi_hot_sizes",
                    self.multi_hot_sizes,
                    f"give one size per feature ({self.num_features}), or null for one-hot",
                )
            if any(k < 1 for k in self.multi_hot_sizes):
                raise ConfigError(
                    "model.multi_hot_sizes", self.multi_hot_sizes, "sizes must be >= 1"
                )
        if self.embedding_dim < 1:
            raise ConfigError("model.embedding_dim", self.embedding_dim, "use a positive dimension")
        if not self.dense_arch_layer_sizes or self.dense_arch_layer_sizes[-1] != self.embedding_dim:
            raise ConfigError(
                "model.dense_arch_layer_sizes",
                self.dense_arch_layer_sizes,
                f"the last size must equal model.embedding_dim={self.embedding_dim}",
            )
        if not self.over_arch_layer_sizes or self.over_arch_layer_sizes[-1] != 1:
            raise ConfigError(
                "model.over_arch_layer_sizes", self.over_arch_layer_sizes, "the last size must be 1"
            )
        if self.num_dense_features < 1:
            raise ConfigError(
                "model.num_dense_features", self.num_dense_features, "use a positive count"
            )
        for name in ("embedding_lr", "dense_lr"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"model.{name}", getattr(self, name), "use a positive rate")
        if self.interaction == "dcn" and (self.dcn_num_layers < 1 or self.dcn_low_rank_dim < 1):
            raise ConfigError(
                "model.dcn_num_layers/dcn_low_rank_dim",
                (self.dcn_num_layers, self.dcn_low_rank_dim),
                "use positive values",
            )
