"""TorchRec ``fused_params`` -> rocmtrain ``OptimizerSpec`` and ``TableBatchedEmbeddingBags`` options.

TorchRec hands every embedding kernel a ``fused_params`` dict: the sharder's own ``fused_params``
merged with what ``apply_optimizer_in_backward`` attached to the table (``torch.optim.SGD`` ->
``{"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": lr}`` etc.). This module maps that dict
onto our kernel's options, and refuses what our kernel cannot do instead of ignoring it::

    spec, kw = tbe_options({"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD,
                            "learning_rate": 0.05, "eps": 1e-8})
    # spec == OptimizerSpec("rowwise_adagrad", lr=0.05, eps=1e-8); kw == {} (kernel defaults)
"""

from __future__ import annotations

from typing import Any

import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType

from rocmtrain.kernels import OptimizerSpec
from rocmtrain.kernels.tbe import check_bounds_check_every

#: ``bounds_check_every`` of the TorchRec kernels unless fused_params sets it: bad ids are counted
#: on the device and the count is read every 100 forwards, so training has no per-step host sync
#: from the check (TorchRec's FBGEMM default, ``BoundsCheckMode.WARNING``, checks on the device
#: too). A standalone :class:`~rocmtrain.kernels.TableBatchedEmbeddingBags` checks every batch.
TORCHREC_BOUNDS_CHECK_EVERY = 100

#: FBGEMM optimizer type -> our ``OptimizerSpec.kind``.
EMB_OPTIM_TO_KIND: dict[EmbOptimType, str] = {
    EmbOptimType.EXACT_SGD: "sgd",
    EmbOptimType.SGD: "sgd",  # FBGEMM's non-exact SGD; ours is always exact (same expectation)
    EmbOptimType.EXACT_ROWWISE_ADAGRAD: "rowwise_adagrad",
    EmbOptimType.ROWWISE_ADAGRAD: "rowwise_adagrad",
    EmbOptimType.ADAM: "adam",
}

#: fused_params keys that tune FBGEMM's caching / memory placement / logging only. They do not
#: change the math of our kernel (which keeps every row in device memory), so they are accepted
#: and have no effect.
NO_EFFECT_KEYS = frozenset(
    {
        "cache_precision",
        "cache_load_factor",
        "cache_algorithm",
        "cache_reserved_memory",
        "prefetch_pipeline",
        "enable_raw_embedding_streaming",
        "embedding_table_index_type",
        "embedding_table_offset_type",
        "max_gradient",
        "enforce_hbm",  # our weights always live in device memory
        "multipass_prefetch_config",
    }
)

_SPARSE_TO_DTYPE = {
    SparseType.FP32: torch.float32,
    SparseType.FP16: torch.float16,
    SparseType.BF16: torch.bfloat16,
}


class FusedParamsError(ValueError):
    """A fused_params entry our kernel cannot honour; the message names it and the fix."""


def _dtype(key: str, value: Any) -> torch.dtype:
    if isinstance(value, torch.dtype) and value in _SPARSE_TO_DTYPE.values():
        return value
    if isinstance(value, SparseType) and value in _SPARSE_TO_DTYPE:
        return _SPARSE_TO_DTYPE[value]
    raise FusedParamsError(
        f"fused_params[{key!r}]={value!r}: rocmtrain kernels support fp32, fp16 and bf16 "
        "(SparseType.FP32/FP16/BF16); use one of those or kernel=fbgemm"
    )


def optimizer_kind(value: Any) -> str:
    """Our ``OptimizerSpec.kind`` for a torchrec/FBGEMM ``optimizer`` entry (clear error if none)."""
    if isinstance(value, str) and value in ("sgd", "rowwise_adagrad", "adam"):
        return value
    if isinstance(value, EmbOptimType) and value in EMB_OPTIM_TO_KIND:
        return EMB_OPTIM_TO_KIND[value]
    hint = ""
    if value == EmbOptimType.EXACT_ADAGRAD:
        hint = (
            " (full per-element Adagrad: use model.embedding_optimizer=rowwise_adagrad, "
            "i.e. torchrec.optim.RowWiseAdagrad, or kernel=fbgemm)"
        )
    raise FusedParamsError(
        f"fused_params['optimizer']={value!r} is not supported by rocmtrain's kernels; use "
        f"EXACT_SGD, EXACT_ROWWISE_ADAGRAD or ADAM (torch.optim.SGD, "
        f"torchrec.optim.RowWiseAdagrad, torch.optim.Adam){hint}"
    )


def tbe_options(fused_params: dict[str, Any] | None) -> tuple[OptimizerSpec, dict[str, Any]]:
    """``(OptimizerSpec, extra TableBatchedEmbeddingBags kwargs)`` for a TorchRec fused_params.

    Accepted keys: ``optimizer``, ``learning_rate``/``lr``, ``eps``, ``beta1``, ``beta2``,
    ``betas`` (torch.optim.Adam style), ``weight_decay``, ``output_dtype``, ``weights_precision``,
    ``stochastic_rounding``, ``deterministic``, ``bounds_check``, ``bounds_check_mode`` (FBGEMM's
    ``BoundsCheckMode``: ``NONE`` turns our check off, any other mode turns it on and a bad id
    raises), ``bounds_check_every`` (default :data:`TORCHREC_BOUNDS_CHECK_EVERY`), ``seed``,
    the no-effect keys in
    :data:`NO_EFFECT_KEYS`, and torch optimizer kwargs at their defaults (``momentum=0``,
    ``lr_decay=0``, ``initial_accumulator_value=0``, ``amsgrad=False`` ...). Anything else raises
    :class:`FusedParamsError` naming the key.
    """
    p = dict(fused_params or {})
    spec_kw: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    if "optimizer" in p:
        spec_kw["kind"] = optimizer_kind(p.pop("optimizer"))
    for key in ("learning_rate", "lr"):
        if key in p:
            spec_kw["lr"] = float(p.pop(key))
    for key in ("eps", "beta1", "beta2", "weight_decay"):
        if key in p:
            spec_kw[key] = float(p.pop(key))
    if "betas" in p:
        b1, b2 = p.pop("betas")
        spec_kw["beta1"], spec_kw["beta2"] = float(b1), float(b2)
    if "output_dtype" in p:
        extra["output_dtype"] = _dtype("output_dtype", p.pop("output_dtype"))
    if "weights_precision" in p:
        extra["weights_dtype"] = _dtype("weights_precision", p.pop("weights_precision"))
    for key in ("stochastic_rounding", "deterministic", "bounds_check"):
        if key in p:
            extra[key] = bool(p.pop(key))
    if "bounds_check_mode" in p:
        # FBGEMM: FATAL raises, WARNING/IGNORE clamp bad ids, NONE skips the check. Ours raises
        # a clear error for any bad id when the check is on (never reads out of bounds).
        mode = p.pop("bounds_check_mode")
        extra["bounds_check"] = getattr(mode, "name", str(mode)).upper() != "NONE"
    every = p.pop("bounds_check_every", TORCHREC_BOUNDS_CHECK_EVERY)
    try:
        extra["bounds_check_every"] = check_bounds_check_every(
            every, "fused_params['bounds_check_every']"
        )
    except ValueError as exc:
        raise FusedParamsError(str(exc)) from exc
    if "seed" in p:
        extra["seed"] = int(p.pop("seed"))
    # torch optimizer kwargs that are fine at their default value only
    defaults = {
        "momentum": 0,
        "dampening": 0,
        "nesterov": False,
        "maximize": False,
        "lr_decay": 0,
        "initial_accumulator_value": 0,
        "amsgrad": False,
        "foreach": None,
        "differentiable": False,
        "fused": None,
        "capturable": False,
        "gradient_clipping": False,
    }
    for key, default in defaults.items():
        if key in p:
            value = p.pop(key)
            if value != default and not (value is None and default is False):
                raise FusedParamsError(
                    f"fused_params[{key!r}]={value!r}: rocmtrain kernels implement only the "
                    f"default ({default!r}); drop it or use kernel=fbgemm"
                )
    for key in list(p):
        if key in NO_EFFECT_KEYS:
            p.pop(key)
    if p:
        raise FusedParamsError(
            f"fused_params keys {sorted(p)} are not understood by rocmtrain's kernels (known: "
            "optimizer, learning_rate, eps, beta1, beta2, weight_decay, output_dtype, "
            "weights_precision, stochastic_rounding, deterministic, bounds_check, "
            "bounds_check_every, seed); "
            "remove them or use kernel=fbgemm"
        )
    try:
        spec = OptimizerSpec(**spec_kw)
    except ValueError as exc:
        raise FusedParamsError(f"fused_params: {exc}") from exc
    return spec, extra
