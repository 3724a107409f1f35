"""Apply a :class:`PrecisionConfig`'s process-global numerics, report them, and put them back.

    session = NumericsSession(cfg, run_dir=Path("runs/x"))
    for line in session.apply():      # also logged: "precision: <setting>: <old> -> <new> (<note>)"
        ...
    session.restore()                 # everything back as it was (tested by snapshot comparison)

What it sets (each line says whether it has an effect on this platform):
- ``torch.set_float32_matmul_precision``: ``highest`` unless ``allow_xf32`` on hardware with TF32/XF32
  (sm_80+, gfx942); on gfx942 also ``HIPBLASLT_ALLOW_TF32=1`` (read by older PyTorch).
- ``allow_tf32`` (cuBLAS/hipBLASLt and cuDNN/MIOpen): off unless ``allow_xf32``; on gfx90a and CPU
  the report says the flag has no effect.
- ``allow_fp16/bf16_reduced_precision_reduction``: off by default (fp32 accumulation); reported as
  "unsupported on ROCm" there (AMD's compatibility page), "CUDA only" on CPU.
- ``preferred_blas_library``: hipblaslt/hipblas/cublaslt/cublas (aliases) on a GPU.
- TunableOp: ``PYTORCH_TUNABLEOP_*`` env (through ``apply_env``) and ``torch.cuda.tunable``
  where it works; one results file per arch and device in ``<run_dir>/tunableop``.
- ``ROCBLAS_INTERNAL_FP16_ALT_IMPL`` / ``MIOPEN_DEBUG_CONVOLUTION_ATTRIB_FP16_ALT_IMPL`` for
  ``fp16_alt_impl=on|off`` (MI200 fp16 denormal flush).
Env vars go through :func:`rocmtrain.comms.env.apply_env`; a value the user exported wins.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import torch

from rocmtrain import platform
from rocmtrain.comms.env import apply_env
from rocmtrain.config.precision import PrecisionConfig
from rocmtrain.precision import state
from rocmtrain.precision.capabilities import ArchCapabilities, current_capabilities

log = logging.getLogger("rocmtrain.precision")

XF32_WARNING = (
    "TF32/XF32 matmuls enabled (precision.allow_xf32=true): fp32 GEMM inputs are rounded to a 10-bit "
    "mantissa, so their error is close to bf16 (~1e-3 relative), not fp32 (~1e-7)"
)


def tunableop_filename(results_dir: Path, arch: str | None) -> Path:
    """``<dir>/tunableop_results_<arch>_%d.csv``; PyTorch replaces ``%d`` by the device ordinal."""
    return results_dir / f"tunableop_results_{arch or 'cpu'}_%d.csv"


class NumericsSession:
    """One application of a config's global numerics, restorable exactly once."""

    def __init__(
        self,
        cfg: PrecisionConfig,
        *,
        run_dir: str | Path | None = None,
        caps: ArchCapabilities | None = None,
    ) -> None:
        self._cfg = cfg
        self._run_dir = Path(run_dir) if run_dir else None
        self._caps = caps
        self._before: dict[str, Any] | None = None
        self._keep: tuple[str, ...] = ()
        self.report: list[str] = []

    @property
    def active(self) -> bool:
        return self._before is not None

    def _line(self, text: str, *, warn: bool = False) -> None:
        self.report.append(text)
        (log.warning if warn else log.info)("precision: %s", text)

    def _set(self, name: str, getter: Any, setter: Any, value: Any, note: str = "") -> None:
        old = getter()
        if old != value:
            setter(value)
        suffix = f" ({note})" if note else ""
        self._line(
            f"{name}: {old} -> {value}{suffix}" if old != value else f"{name}: {value}{suffix}"
        )

    def apply(self) -> list[str]:
        """Apply everything; returns the report lines (also logged). Idempotent while active."""
        if self.active:
            return self.report
        self._before = state.snapshot()
        caps = self._caps or current_capabilities()
        backend = "cpu" if caps.vendor == "cpu" else ("rocm" if caps.vendor == "amd" else "cuda")
        self._line(f"mode={self._cfg.mode} on {backend} ({caps.arch})")
        self._matmul(caps, backend)
        self._reduction(caps, backend)
        self._blas(backend)
        self._tunableop(caps, backend)
        self._alt_impl(caps)
        return self.report

    # -- pieces -------------------------------------------------------------------------------
    def _matmul(self, caps: ArchCapabilities, backend: str) -> None:
        cfg = self._cfg
        m = torch.backends.cuda.matmul
        want_xf32 = cfg.allow_xf32 and caps.xf32 and backend != "cpu"
        if cfg.allow_xf32 and not want_xf32:
            where = "CPU" if backend == "cpu" else caps.arch
            self._line(
                f"allow_xf32=true has no effect on {where}: no TF32/XF32 matmul hardware; "
                "matmuls stay full fp32",
                warn=True,
            )
        precision = (
            (cfg.matmul_precision if cfg.matmul_precision != "highest" else "high")
            if want_xf32
            else "highest"
        )
        self._set(
            "float32_matmul_precision",
            torch.get_float32_matmul_precision,
            torch.set_float32_matmul_precision,
            precision,
        )
        note = (
            "effective"
            if caps.xf32 and backend != "cpu"
            else f"no effect on {caps.arch}: no TF32/XF32"
        )
        self._set(
            "cuda.matmul.allow_tf32",
            lambda: m.allow_tf32,
            lambda v: setattr(m, "allow_tf32", v),
            want_xf32,
            note,
        )
        cudnn = torch.backends.cudnn
        self._set(
            "cudnn.allow_tf32",
            lambda: cudnn.allow_tf32,
            lambda v: setattr(cudnn, "allow_tf32", v),
            want_xf32,
            note,
        )
        if want_xf32:
            self._line(XF32_WARNING, warn=True)
            if caps.vendor == "amd":
                self._env({"HIPBLASLT_ALLOW_TF32": "1"}, "XF32 gate read by older PyTorch on ROCm")

    def _reduction(self, caps: ArchCapabilities, backend: str) -> None:
        m = torch.backends.cuda.matmul
        value = self._cfg.reduced_precision_reduction
        if backend == "cpu":
            note = "CUDA/ROCm GEMM flag: no effect on CPU"
        elif caps.reduced_precision_reduction_flags == "unsupported":
            note = "marked unsupported on ROCm by AMD: settable, no documented effect"
        else:
            note = "effective: " + ("16-bit reduction allowed" if value else "fp32 accumulation")
        for flag in (
            "allow_fp16_reduced_precision_reduction",
            "allow_bf16_reduced_precision_reduction",
        ):
            self._set(
                f"cuda.matmul.{flag}",
                lambda f=flag: getattr(m, f),
                lambda v, f=flag: setattr(m, f, v),
                value,
                note,
            )

    def _blas(self, backend: str) -> None:
        name = self._cfg.blas_backend
        if name == "default":
            return
        if backend == "cpu":
            self._line(f"blas_backend={name}: no effect without a GPU", warn=True)
            return
        native = ("hipblaslt", "hipblas") if backend == "rocm" else ("cublaslt", "cublas")
        if name not in native:
            self._line(
                f"blas_backend={name} on {backend}: PyTorch treats it as its alias {native[0 if name.endswith('lt') else 1]}"
            )

        def _get() -> str:
            return str(torch.backends.cuda.preferred_blas_library()).rsplit(".", 1)[-1].lower()

        self._set("preferred_blas_library", _get, torch.backends.cuda.preferred_blas_library, name)

    def _tunableop(self, caps: ArchCapabilities, backend: str) -> None:
        tcfg = self._cfg.tunableop
        if not tcfg.enabled:
            return
        root = (
            Path(tcfg.results_dir)
            if tcfg.results_dir
            else (self._run_dir or Path(".")) / "tunableop"
        )
        root.mkdir(parents=True, exist_ok=True)
        filename = tunableop_filename(root, caps.arch)
        env = {
            "PYTORCH_TUNABLEOP_ENABLED": "1",
            "PYTORCH_TUNABLEOP_TUNING": "1" if tcfg.tuning else "0",
            "PYTORCH_TUNABLEOP_FILENAME": str(filename),
        }
        if tcfg.verbose:
            env["PYTORCH_TUNABLEOP_VERBOSE"] = "1"
        if tcfg.max_tuning_duration_ms:
            env["PYTORCH_TUNABLEOP_MAX_TUNING_DURATION_MS"] = str(tcfg.max_tuning_duration_ms)
        self._env(env, "TunableOp")
        existing = sorted(root.glob(f"tunableop_results_{caps.arch}_*.csv"))
        if backend == "cpu":
            self._line(
                "TunableOp: no effect on CPU (GEMM tuning is a CUDA/ROCm feature)", warn=True
            )
            return
        tunable = state._tunable()
        if tunable is not None:
            tunable.set_filename(str(filename), True)
            tunable.tuning_enable(tcfg.tuning)
            tunable.enable(True)
            if tcfg.tuning:
                # PyTorch writes new tunings while TunableOp+tuning are on at process exit: keep them
                self._keep = ("tunableop.enabled", "tunableop.tuning", "tunableop.filename")
        if tcfg.tuning:
            self._line(f"TunableOp: tuning new GEMMs, results written at exit to {filename}")
        elif existing:
            self._line(f"TunableOp: reusing {', '.join(map(str, existing))} (tuning off)")
        else:
            self._line(
                f"TunableOp: enabled with tuning=false but no results at {filename}; GEMMs use the "
                "library defaults. Run once with precision.tunableop.tuning=true to create it",
                warn=True,
            )

    def _alt_impl(self, caps: ArchCapabilities) -> None:
        choice = self._cfg.fp16_alt_impl
        if choice == "default":
            if caps.fp16_mfma_flushes_denormals:
                self._line(
                    f"{caps.arch}: fp16 MFMA flush denormals; PyTorch uses the denormal-safe alternate "
                    "kernels in backward (precision.fp16_alt_impl=on to use them forward too)"
                )
            return
        value = "1" if choice == "on" else "0"
        note = (
            "MI200 fp16 denormal flush"
            if caps.fp16_mfma_flushes_denormals
            else f"no effect on {caps.arch}: only MI200 flushes fp16 denormals"
        )
        self._env(
            {
                "ROCBLAS_INTERNAL_FP16_ALT_IMPL": value,
                "MIOPEN_DEBUG_CONVOLUTION_ATTRIB_FP16_ALT_IMPL": value,
            },
            f"fp16_alt_impl={choice}; {note}; read once by rocBLAS/MIOpen before the first GEMM",
        )

    def _env(self, changes: dict[str, str], why: str) -> None:
        changed = apply_env(changes, source="rocmtrain.precision")
        for name, value in changes.items():
            if name in changed:
                old, new = changed[name]
                self._line(f"env {name}: {old} -> {new} ({why})")
            elif os.environ.get(name) == value:
                self._line(f"env {name}: {value} (already set; {why})")
            else:
                self._line(
                    f"env {name}={value} not applied: the user's {os.environ.get(name)!r} wins ({why})",
                    warn=True,
                )

    def restore(self) -> list[str]:
        """Put every global setting back; returns the names restored (each logged)."""
        if self._before is None:
            return []
        before, self._before = self._before, None
        now = state.snapshot()
        changed = state.restore(before, keep=self._keep)
        for key in changed:
            log.info("precision: restored %s: %s -> %s", key, now.get(key), before.get(key))
        if self._keep:
            log.info(
                "precision: TunableOp tuning stays on (torch.cuda.tunable) until the process exits so "
                "PyTorch can write %s; the PYTORCH_TUNABLEOP_* env vars were restored",
                now.get("tunableop.filename"),
            )
        left = {
            k: v for k, v in state.diff(before, state.snapshot()).items() if k not in self._keep
        }
        if left:
            log.warning("precision: could not restore %s", left)
        return changed


def platform_summary(device: str = "cuda") -> dict[str, Any]:
    """Backend/arch/versions for reports (precision matrix JSON, logs); ``device="cpu"`` describes
    the CPU even on a GPU machine."""
    info = platform.device_info(0)
    on_cpu = device == "cpu" or info.backend == "cpu"
    return {
        "backend": "cpu" if on_cpu else info.backend,
        "device": "cpu" if on_cpu else info.name,
        "arch": "cpu" if on_cpu else (info.arch or "unknown"),
        "torch": torch.__version__,
        "hip": getattr(torch.version, "hip", None),
        "cuda": torch.version.cuda,
        "triton": platform.package_version("triton"),
        "gpu_present": info.backend != "cpu",
    }
