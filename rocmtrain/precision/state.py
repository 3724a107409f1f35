"""Snapshot and restore every process-global numerics setting the precision plugin may touch.

    snap = snapshot()          # torch.backends flags, float32 matmul precision, BLAS, TunableOp, env
    ...                        # change things
    restore(snap)              # set back; returns the names that were changed back
    assert snapshot() == snap

Covered: ``torch.get_float32_matmul_precision()``, ``torch.backends.cuda.matmul.allow_tf32`` /
``allow_fp16_reduced_precision_reduction`` / ``allow_bf16_reduced_precision_reduction`` /
``allow_fp16_accumulation``, ``torch.backends.cudnn.allow_tf32``, the ``fp32_precision`` attributes of
PyTorch >= 2.9 (``torch.backends``, ``.cuda.matmul``, ``.cudnn``, ``.cudnn.conv``, ``.cudnn.rnn``,
``.mkldnn``, ``.mkldnn.matmul``...), ``preferred_blas_library`` (GPU builds), TunableOp's
enabled/tuning/filename (where ``torch.cuda.tunable`` works) and
the env vars in :data:`ENV_VARS`.
Env vars are restored through :func:`rocmtrain.comms.env.apply_env` (the one env writer).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch

from rocmtrain.comms.env import apply_env

#: every env var the precision plugin may set
ENV_VARS = (
    "PYTORCH_TUNABLEOP_ENABLED",
    "PYTORCH_TUNABLEOP_TUNING",
    "PYTORCH_TUNABLEOP_FILENAME",
    "PYTORCH_TUNABLEOP_VERBOSE",
    "PYTORCH_TUNABLEOP_MAX_TUNING_DURATION_MS",
    "TORCH_BLAS_PREFER_HIPBLASLT",
    "HIPBLASLT_ALLOW_TF32",
    "ROCBLAS_INTERNAL_FP16_ALT_IMPL",
    "MIOPEN_DEBUG_CONVOLUTION_ATTRIB_FP16_ALT_IMPL",
)

_MATMUL_FLAGS = (
    "allow_tf32",
    "allow_fp16_reduced_precision_reduction",
    "allow_bf16_reduced_precision_reduction",
    "allow_fp16_accumulation",
)


def _fp32_precision_objects() -> dict[str, Any]:
    b = torch.backends
    candidates = {
        "backends": b,
        "cuda.matmul": b.cuda.matmul,
        "cudnn": b.cudnn,
        "cudnn.conv": getattr(b.cudnn, "conv", None),
        "cudnn.rnn": getattr(b.cudnn, "rnn", None),
        "mkldnn": getattr(b, "mkldnn", None),
        "mkldnn.matmul": getattr(getattr(b, "mkldnn", None), "matmul", None),
        "mkldnn.conv": getattr(getattr(b, "mkldnn", None), "conv", None),
        "mkldnn.rnn": getattr(getattr(b, "mkldnn", None), "rnn", None),
    }
    out = {}
    for name, obj in candidates.items():
        try:
            if obj is not None and isinstance(obj.fp32_precision, str):
                out[name] = obj
        except (AttributeError, RuntimeError):
            continue
    return out


def _blas_get() -> str | None:
    if not torch.cuda.is_available():
        return None
    return str(torch.backends.cuda.preferred_blas_library()).rsplit(".", 1)[-1].lower()


def _tunable() -> Any | None:
    """``torch.cuda.tunable`` when its C++ side exists in this build (not on CPU wheels)."""
    try:
        import torch.cuda.tunable as tunable

        tunable.is_enabled()
        return tunable
    except (ImportError, AttributeError, RuntimeError):
        return None


def snapshot() -> dict[str, Any]:
    """All covered settings as a flat, comparable dict."""
    snap: dict[str, Any] = {"float32_matmul_precision": torch.get_float32_matmul_precision()}
    for flag in _MATMUL_FLAGS:
        try:
            snap[f"cuda.matmul.{flag}"] = getattr(torch.backends.cuda.matmul, flag)
        except (AttributeError, RuntimeError):
            continue
    snap["cudnn.allow_tf32"] = torch.backends.cudnn.allow_tf32
    for name, obj in _fp32_precision_objects().items():
        snap[f"{name}.fp32_precision"] = obj.fp32_precision
    snap["preferred_blas_library"] = _blas_get()
    tunable = _tunable()
    if tunable is not None:
        snap["tunableop.enabled"] = tunable.is_enabled()
        snap["tunableop.tuning"] = tunable.tuning_is_enabled()
        snap["tunableop.filename"] = tunable.get_filename()
    for var in ENV_VARS:
        snap[f"env.{var}"] = os.environ.get(var)
    return snap


def _setters() -> list[tuple[str, Callable[[Any], None]]]:
    """(key, setter) in restore order: coarse settings first, fine-grained ones last."""
    m = torch.backends.cuda.matmul
    setters: list[tuple[str, Callable[[Any], None]]] = [
        ("float32_matmul_precision", torch.set_float32_matmul_precision)
    ]
    for flag in _MATMUL_FLAGS:
        setters.append((f"cuda.matmul.{flag}", lambda v, f=flag: setattr(m, f, v)))
    setters.append(("cudnn.allow_tf32", lambda v: setattr(torch.backends.cudnn, "allow_tf32", v)))
    for name, obj in _fp32_precision_objects().items():
        setters.append((f"{name}.fp32_precision", lambda v, o=obj: setattr(o, "fp32_precision", v)))
    setters.append(
        ("preferred_blas_library", lambda v: torch.backends.cuda.preferred_blas_library(v))
    )
    tunable = _tunable()
    if tunable is not None:
        setters.append(("tunableop.filename", tunable.set_filename))
        setters.append(("tunableop.tuning", tunable.tuning_enable))
        setters.append(("tunableop.enabled", tunable.enable))
    return setters


def restore(
    snap: dict[str, Any], *, source: str = "rocmtrain.precision", keep: tuple[str, ...] = ()
) -> list[str]:
    """Set everything in ``snap`` back except the keys in ``keep``; returns the keys restored."""
    current = snapshot()
    changed = [k for k, v in snap.items() if current.get(k) != v and k not in keep]
    if not changed:
        return []
    for key, setter in _setters():
        if key in changed and snap[key] is not None and snapshot().get(key) != snap[key]:
            setter(snap[key])
    env = {k[4:]: v for k, v in snap.items() if k.startswith("env.") and k in changed}
    if env:
        apply_env(env, force=True, source=f"{source} (restore)")
    return changed


def diff(before: dict[str, Any], after: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """``{key: (before, after)}`` for every setting that differs."""
    keys = set(before) | set(after)
    return {k: (before.get(k), after.get(k)) for k in sorted(keys) if before.get(k) != after.get(k)}
