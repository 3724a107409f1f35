"""DLRM / DLRM-DCNv2 built from ``torchrec.models.dlrm`` and configured by ``ModelConfig``.

Shapes: ``B`` samples per rank, ``F`` sparse features (one table each, ``t_cat_<f>`` reads
``cat_<f>``), ``D`` embedding dim, 13 dense features::

    dense  float32 [B, 13] ──> bottom MLP ──> [B, D] ─┐
    KJT keys cat_0..cat_{F-1}, L[f][b] ids per sample  ├─> dot / DCN interaction ─> top MLP ─> [B] logit
        ──> EmbeddingBagCollection (pooled) [B, F*D] ──┘

The embedding tables are created on the ``meta`` device: ``TorchRecStrategy`` shards and
materialises them on the right rank (``DistributedModelParallel``). The embedding optimizer is
attached with ``apply_optimizer_in_backward`` so TorchRec fuses it into the TBE backward.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torchrec.models.dlrm import DLRM, DLRM_DCN, SparseArch
from torchrec.modules.crossnet import LowRankCrossNet
from torchrec.modules.embedding_configs import DataType, EmbeddingBagConfig, PoolingType
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.rowwise_adagrad import RowWiseAdagrad
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor, KeyedTensor

from rocmtrain.config import ConfigError
from rocmtrain.config.model import ModelConfig

log = logging.getLogger(__name__)


def feature_names(num_features: int) -> list[str]:
    """Sparse feature keys ``cat_0 .. cat_{F-1}`` (TorchRec's ``DEFAULT_CAT_NAMES`` order)."""
    return [f"cat_{i}" for i in range(num_features)]


def table_name(feature: str) -> str:
    """The table reading ``feature`` (``cat_3`` -> ``t_cat_3``)."""
    return f"t_{feature}"


def embedding_bag_configs(cfg: ModelConfig) -> list[EmbeddingBagConfig]:
    """One ``EmbeddingBagConfig`` per feature, rows capped by ``max_rows_per_table``."""
    pooling = PoolingType.SUM if cfg.pooling == "sum" else PoolingType.MEAN
    data_type = {"fp32": DataType.FP32, "fp16": DataType.FP16}[cfg.embedding_weight_dtype]
    return [
        EmbeddingBagConfig(
            name=table_name(feature),
            embedding_dim=cfg.embedding_dim,
            num_embeddings=rows,
            feature_names=[feature],
            pooling=pooling,
            data_type=data_type,
        )
        for feature, rows in zip(feature_names(cfg.num_features), cfg.table_rows(), strict=True)
    ]


def build_dlrm(cfg: ModelConfig, *, dense_device: torch.device | None = None) -> nn.Module:
    """TorchRec ``DLRM`` (``interaction: dot``) or ``DLRM_DCN`` with tables on the meta device.

    ``dense_device`` holds the MLPs (``None`` = CPU; ``meta`` for planning without memory).
    """
    ebc = EmbeddingBagCollection(tables=embedding_bag_configs(cfg), device=torch.device("meta"))
    common = dict(
        embedding_bag_collection=ebc,
        dense_in_features=cfg.num_dense_features,
        dense_arch_layer_sizes=list(cfg.dense_arch_layer_sizes),
        over_arch_layer_sizes=list(cfg.over_arch_layer_sizes),
        dense_device=dense_device,
    )
    if cfg.interaction == "dcn":
        model = DLRM_DCN(
            **common, dcn_num_layers=cfg.dcn_num_layers, dcn_low_rank_dim=cfg.dcn_low_rank_dim
        )
        if cfg.dcn_autocast_residual:
            model.inter_arch.crossnet.__class__ = AutocastResidualCrossNet
        if cfg.compile_interaction and not cfg.compile_dense:
            compile_crossnet(
                model.inter_arch.crossnet,
                mode=cfg.compile_mode,
                ddp_optimizer=cfg.compile_ddp_optimizer,
            )
    else:
        model = DLRM(**common)
    model.sparse_arch.__class__ = OrderedSparseArch
    if cfg.compile_dense:
        compile_dense(model, mode=cfg.compile_mode, ddp_optimizer=cfg.compile_ddp_optimizer)
    return model


def compile_dense(model: nn.Module, *, mode: str = "default", ddp_optimizer: bool = False) -> None:
    """``torch.compile`` the ``forward`` of the bottom MLP, the interaction and the top MLP in place.

    The ``forward`` methods are compiled, not the modules' calls: the precision policy's fp32
    islands are forward hooks on exactly these modules and stay outside the graphs (autocast is
    switched around the compiled code, which Dynamo then sees as a constant), and no module is
    wrapped, so parameter names, state-dict keys and TorchRec's pipeline tracing (these modules
    hold no sharded table, so it treats them as leaves) do not change. Static shapes: one graph per
    batch size, grad mode and autocast state. ``mode``: ``torch.compile``'s (``reduce-overhead``
    and ``max-autotune`` replay each part as a CUDA graph; the caller marks each step,
    :func:`mark_step`). ``ddp_optimizer``: see :func:`compile_whole`. The interaction hands the
    embedding kernel a contiguous gradient (:class:`ContiguousGrad`).
    """
    model.inter_arch.forward = _contiguous_sparse_grad(model.inter_arch.forward)
    for part in (model.dense_arch, model.inter_arch, model.over_arch):
        part.forward = compile_whole(part.forward, mode=mode, ddp_optimizer=ddp_optimizer)


class ContiguousGrad(torch.autograd.Function):
    """Identity whose backward hands on a contiguous gradient.

    The interaction concatenates the bottom MLP's output and the pooled embeddings; the gradient
    of the embeddings is then a strided slice of the concatenation's gradient, and the embedding
    kernel's backward (FBGEMM's TBE) copies it to a contiguous tensor first, an eager strided copy
    of ``[B, F*D]`` (one of the slower kernels of a DLRM-DCNv2 step). Applied inside the compiled
    interaction, the copy becomes part of the graph, where Inductor writes it with vectorized
    stores or straight from the kernel that makes the gradient.
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad.contiguous()


def _contiguous_sparse_grad(forward: Callable[..., Any]) -> Callable[..., Any]:
    """An interaction's ``forward(dense_features, sparse_features)`` whose ``sparse_features``
    gradient comes back contiguous (:class:`ContiguousGrad`)."""

    @functools.wraps(forward)
    def run(dense_features: torch.Tensor, sparse_features: torch.Tensor) -> torch.Tensor:
        return forward(
            dense_features=dense_features, sparse_features=ContiguousGrad.apply(sparse_features)
        )

    return run


def compile_whole(
    fn: Callable[..., Any], *, mode: str = "default", ddp_optimizer: bool = False
) -> Callable[..., Any]:
    """``torch.compile(fn)`` as one static-shape graph, also where ``fn`` runs inside DDP.

    Called inside ``DistributedDataParallel.forward`` (TorchRec puts the dense part there, on one
    GPU too), Dynamo's DDP optimizer splits a compiled function into one graph per DDP bucket (25
    MB of parameters: at DLRM-DCNv2 sizes three graphs for the cross net, two for the top MLP). At each split the
    autograd engine then adds the gradient contributions of a tensor the graphs share in eager
    (the cross net's ``x_0``, ``[B, 27*D]``) and, with CUDA graphs, that sum is copied into the
    next graph's static input: two passes over ``[B, 27*D]`` a step, more launches, no gain on one
    GPU. Here each part stays one graph (``torch._dynamo.config.optimize_ddp=False`` while it is
    traced and run); DDP's C++ reducer still all-reduces its gradients, bucket by bucket, once the
    part's backward has produced them, overlapped with the backward of the parts before it and
    the embedding backward. ``ddp_optimizer=True`` (``model.compile_ddp_optimizer``) leaves
    Dynamo's split on.
    """
    compiled = torch.compile(fn, dynamic=False, mode=mode)
    if ddp_optimizer:
        return compiled

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        with torch._dynamo.config.patch(optimize_ddp=False):
            return compiled(*args, **kwargs)

    return run


class OrderedSparseArch(SparseArch):
    """TorchRec's ``SparseArch`` without its copy when the pooled embeddings are already in order.

    ``SparseArch`` splits the collection's ``[B, F*D]`` output into one tensor per feature and
    concatenates them back in its feature order: a full copy of the pooled embeddings in the
    forward and another of their gradient in the backward. When the output's keys are already in
    that order (always, for the collections :func:`build_dlrm` makes) the result is the same
    tensor viewed as ``[B, F, D]``. Same parameters and state dict (the class of a built arch is
    swapped); any other key order takes TorchRec's path.
    """

    def forward(self, features: KeyedJaggedTensor) -> torch.Tensor:
        pooled = self.embedding_bag_collection(features)
        return _in_feature_order(pooled, self.sparse_feature_names, self.F, self.D)


@torch.fx.wrap  # one call in TorchRec's traced pipeline graph: the key check runs on real data
def _in_feature_order(pooled: KeyedTensor, names: list[str], f: int, d: int) -> torch.Tensor:
    """``pooled``'s values as ``[B, f, d]`` in the order ``names``: a view when already so."""
    if list(pooled.keys()) == names:
        return pooled.values().reshape(-1, f, d)
    sparse = pooled.to_dict()
    return torch.cat([sparse[name] for name in names], dim=1).reshape(-1, f, d)


class AutocastResidualCrossNet(LowRankCrossNet):
    """TorchRec's ``LowRankCrossNet`` whose residual stream runs in the autocast dtype.

    Same parameters and state dict (the class of a built cross net is swapped, nothing is copied).
    Eager TorchRec computes ``x_0 * (W V x_l + b) + x_l`` with an fp32 ``x_0``/``x_l`` and bias, so
    under autocast every cross layer casts ``x_l`` to bf16 for its GEMM and does its elementwise
    work and saves its activations in fp32. Here ``x_0`` and the bias are cast once and ``x_l``
    stays bf16: the same GEMMs, half the elementwise bytes. Without autocast it is TorchRec's
    forward.
    """

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        device = input.device.type
        if not torch.is_autocast_enabled(device):
            return super().forward(input)
        dtype = torch.get_autocast_dtype(device)
        x_0 = input.to(dtype)
        x_l = x_0
        for layer in range(self._num_layers):
            x_l_v = nn.functional.linear(x_l, self.V_kernels[layer])
            x_l_w = nn.functional.linear(x_l_v, self.W_kernels[layer])
            x_l = x_0 * (x_l_w + self.bias[layer].to(dtype)) + x_l
        return x_l


def compile_crossnet(
    crossnet: nn.Module, *, mode: str = "default", ddp_optimizer: bool = False
) -> None:
    """``torch.compile`` a cross network's ``forward`` in place (:func:`compile_whole`: parameter
    names and state-dict keys stay as they are, so checkpoints and the sharding plan do not
    change).

    Static shapes: one graph per batch size and grad mode (training, validation); the fused
    elementwise kernels keep eager's dtypes.
    """
    crossnet.forward = compile_whole(crossnet.forward, mode=mode, ddp_optimizer=ddp_optimizer)


def mark_step(cfg: ModelConfig) -> None:
    """Start a new step of the CUDA-graphed parts (``model.compile_mode=reduce-overhead`` or
    ``max-autotune``).

    CUDA graph trees reuse their output buffers from one replay to the next; marking each step's
    start tells them the previous step's outputs are no longer read, so the next replay may
    overwrite them instead of recording a new graph branch. Every forward of a step (training or
    validation) runs after one mark. Does nothing without CUDA graphs.
    """
    if cfg.uses_cuda_graphs:
        torch.compiler.cudagraph_mark_step_begin()


def warn_without_cuda_graphs(cfg: ModelConfig, device: torch.device) -> bool:
    """Log a warning when ``model.compile_mode`` asks for CUDA graphs that cannot be recorded on
    ``device`` (PyTorch then runs the compiled parts without graphs, without saying so); True if
    so."""
    if not cfg.uses_cuda_graphs or device.type == "cuda":
        return False
    log.warning(
        "model.compile_mode=%s: the dense parts run on %s, which has no CUDA/HIP graphs; they "
        "run without graphs (set model.compile_mode=default to silence this)",
        cfg.compile_mode,
        device.type,
    )
    return True


def apply_embedding_optimizer(module: nn.Module, cfg: ModelConfig) -> None:
    """Attach the fused (in-backward) embedding optimizer to every EmbeddingBagCollection."""
    kind = cfg.embedding_optimizer
    if kind == "adagrad":
        cls, kwargs = torch.optim.Adagrad, {"lr": cfg.embedding_lr, "eps": cfg.embedding_eps}
    elif kind == "rowwise_adagrad":
        cls, kwargs = RowWiseAdagrad, {"lr": cfg.embedding_lr, "eps": cfg.embedding_eps}
    elif kind == "adam":
        cls, kwargs = torch.optim.Adam, {"lr": cfg.embedding_lr, "eps": cfg.embedding_eps}
    else:
        cls, kwargs = torch.optim.SGD, {"lr": cfg.embedding_lr}
    for sub in module.modules():
        if isinstance(sub, EmbeddingBagCollection):
            apply_optimizer_in_backward(cls, sub.parameters(), kwargs)
            if cfg.embedding_output_dtype == "autocast":
                raise ConfigError(
                    "model.embedding_output_dtype",
                    "autocast",
                    "it depends on the run's precision: build the module from "
                    "rocmtrain.config.schema.resolve_model_config(run_config), or give the dtype "
                    "(fp32, bf16, fp16)",
                )
            _set_kernel_options(sub, kernel_options(cfg))


def kernel_options(cfg: ModelConfig) -> dict[str, Any]:
    """The embedding kernel's options that differ from its defaults: ``output_dtype``
    (``model.embedding_output_dtype``) and ``bounds_check_mode`` (``model.embedding_bounds_check
    =off``; ``auto`` unresolved keeps the check)."""
    from fbgemm_gpu.split_embedding_configs import SparseType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import BoundsCheckMode

    options: dict[str, Any] = {}
    if cfg.embedding_output_dtype != "fp32":
        dtypes = {"bf16": SparseType.BF16, "fp16": SparseType.FP16}
        options["output_dtype"] = dtypes[cfg.embedding_output_dtype]
    if cfg.embedding_bounds_check == "off":
        options["bounds_check_mode"] = BoundsCheckMode.NONE
    return options


def _set_kernel_options(ebc: nn.Module, options: dict[str, Any]) -> None:
    """Hand ``options`` to the embedding kernel of every table of ``ebc``.

    TorchRec merges each table parameter's in-backward optimizer kwargs into the kernel's
    ``fused_params`` when it shards the table, so that is where they go. They are added after
    ``apply_optimizer_in_backward``, which builds the optimizer from the same kwargs and would
    reject an unknown one.
    """
    if not options:
        return
    for param in ebc.parameters():
        kwargs = param._optimizer_kwargs  # type: ignore[attr-defined]
        kwargs[-1] = {**kwargs[-1], **options}


def dense_optimizer(params, cfg: ModelConfig) -> torch.optim.Optimizer:
    """The regular optimizer of the dense (MLP) parameters (``model.dense_optimizer_impl``)."""
    params = list(params)
    if cfg.dense_optimizer == "adagrad":
        cls, kwargs = torch.optim.Adagrad, {"lr": cfg.dense_lr}
    elif cfg.dense_optimizer == "adam":
        cls, kwargs = torch.optim.Adam, {"lr": cfg.dense_lr}
    else:
        cls, kwargs = torch.optim.SGD, {"lr": cfg.dense_lr}
    impl = cfg.dense_optimizer_impl
    if impl == "fused" and params and not _has_fused_kernel(cls, params[0].device):
        log.warning(
            "model.dense_optimizer_impl=fused: torch %s has no fused %s kernel for %s; "
            "running foreach",
            torch.__version__,
            cls.__name__,
            params[0].device.type,
        )
        impl = "foreach"
    if impl == "fused":
        kwargs["fused"] = True
    elif impl in ("foreach", "for_loop"):
        kwargs["foreach"] = impl == "foreach"
    optimizer = cls(params, **kwargs)
    return compile_step(optimizer) if impl == "compiled" else optimizer


def compile_step(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """``optimizer`` whose update runs as one ``torch.compile``'d function (PyTorch's "Compiling
    the optimizer with torch.compile" recipe): Inductor fuses the foreach update's elementwise
    kernels (Adagrad: a dozen multi-tensor launches) into a few. The closure Lightning passes
    (forward and backward) runs eagerly first, outside the compiled function. The learning rate
    is a Python float: changing it (a scheduler) recompiles the update."""
    eager_step = optimizer.step
    compiled = torch.compile(lambda: eager_step(), fullgraph=False)

    def step(closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        compiled()
        return loss

    optimizer.step = step  # type: ignore[method-assign]
    return optimizer


_FUSED_SUPPORT: dict[tuple[type, str], bool] = {}


def _has_fused_kernel(cls: type, device: torch.device) -> bool:
    """Whether ``cls(fused=True)`` can step on ``device`` (one 1-element step, cached): the
    constructor accepts ``fused=True`` for any device PyTorch has some fused optimizer for, and
    a missing kernel only shows at the first step."""
    key = (cls, device.type)
    if key not in _FUSED_SUPPORT:
        p = torch.zeros(1, device=device, requires_grad=True)
        p.grad = torch.ones(1, device=device)
        try:
            cls([p], lr=0.1, fused=True).step()
            _FUSED_SUPPORT[key] = True
        except (RuntimeError, NotImplementedError, TypeError):
            _FUSED_SUPPORT[key] = False
    return _FUSED_SUPPORT[key]


def pooling_factors(cfg: ModelConfig) -> dict[str, float]:
    """Expected ids per sample of each table (multi-hot size, 1 for one-hot): planner input."""
    hot = cfg.multi_hot_sizes or [1] * cfg.num_features
    names = [table_name(f) for f in feature_names(cfg.num_features)]
    return {name: float(k) for name, k in zip(names, hot, strict=True)}
