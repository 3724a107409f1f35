"""Precision schema: Lightning precision mode plus accumulator and BLAS policy.

Composed into the root config as ``cfg.precision`` from the Hydra group ``configs/precision/``
(``precision=fp32|bf16|fp16``); any field can be overridden, e.g.
``precision=bf16 precision.policy.interaction=autocast precision.allow_xf32=true``.
:func:`rocmtrain.precision.plugin.build_precision_plugin` turns it into a Lightning plugin.

Every value is validated once, when the dataclass is built (``__post_init__``); an error names the
field, the bad value, the allowed set and what to write instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rocmtrain.config import ConfigError

MODES = ("32", "bf16-mixed", "16-mixed")
SUBMODULE_PRECISIONS = ("fp32", "autocast")
BLAS_BACKENDS = ("default", "hipblaslt", "hipblas", "cublaslt", "cublas")
MATMUL_PRECISIONS = ("highest", "high", "medium")
FP16_ALT_IMPL = ("default", "on", "off")
NONFINITE_ACTIONS = ("log", "skip_step", "raise")

#: spellings users type for a mode, mapped to Lightning's names
_MODE_ALIASES = {
    "32": "32",
    "32-true": "32",
    "fp32": "32",
    "bf16-mixed": "bf16-mixed",
    "bf16": "bf16-mixed",
    "16-mixed": "16-mixed",
    "16": "16-mixed",
    "fp16": "16-mixed",
}


def _check(name: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(
            f"precision.{name}={value!r} is not valid; allowed: {', '.join(map(repr, allowed))}. "
            f"Set e.g. precision.{name}={allowed[0]}"
        )


@dataclass
class SubmodulePolicy:
    """Per-submodule precision under a mixed mode. ``fp32``: autocast off inside that submodule and
    floating inputs upcast to fp32; ``autocast``: follow the run's mixed mode. Submodules are found by
    name (see ``rocmtrain.precision.policy.GROUP_PATTERNS``). Ignored in mode ``32``."""

    embeddings: str = "fp32"
    """Embedding tables / sparse arch (EmbeddingBagCollection). Lookups are not autocast ops anyway;
    ``fp32`` also keeps any projection inside the sparse arch in fp32."""
    dense_arch: str = "autocast"
    """Bottom MLP over the dense features."""
    interaction: str = "fp32"
    """Feature interaction (DLRM dot interaction, DCN cross net). The dot interaction is cheap in fp32;
    for DCNv2 the cross net is most of the FLOPs, so ``autocast`` there is worth ~2x (see ANCHORS)."""
    over_arch: str = "autocast"
    """Top MLP producing the logit. The loss (BCE with logits) is computed in fp32 by autocast."""

    def __post_init__(self) -> None:
        for name in ("embeddings", "dense_arch", "interaction", "over_arch"):
            _check(f"policy.{name}", getattr(self, name), SUBMODULE_PRECISIONS)


@dataclass
class TunableOpConfig:
    """PyTorch TunableOp (GEMM autotuning on ROCm and CUDA): tune once, then reuse the results file."""

    enabled: bool = False
    """Turn TunableOp on (``PYTORCH_TUNABLEOP_ENABLED=1``). Off: the BLAS library's own heuristics."""
    tuning: bool = False
    """Tune GEMMs that are not in the results file yet (slow first steps). Tune once with ``true``,
    then run with ``false`` to only read the file (``PYTORCH_TUNABLEOP_TUNING``)."""
    results_dir: str = ""
    """Folder of the results files; empty = ``<run_dir>/tunableop``. The file name carries the arch
    and the device ordinal: ``tunableop_results_<arch>_<ordinal>.csv`` (a gfx90a file is never read on
    gfx942). PyTorch rejects a file written by another BLAS/ROCm version (its Validator lines)."""
    max_tuning_duration_ms: int = 0
    """Upper bound of tuning time per GEMM in ms (``PYTORCH_TUNABLEOP_MAX_TUNING_DURATION_MS``);
    0 = PyTorch's default."""
    verbose: bool = False
    """Print TunableOp's own log (``PYTORCH_TUNABLEOP_VERBOSE=1``)."""

    def __post_init__(self) -> None:
        if self.max_tuning_duration_ms < 0:
            raise ConfigError(
                f"precision.tunableop.max_tuning_duration_ms={self.max_tuning_duration_ms} must be "
                ">= 0 (0 = PyTorch's default)"
            )


@dataclass
class LossScalingConfig:
    """Dynamic loss scaling for ``16-mixed`` (``torch.amp.GradScaler``); unused by other modes."""

    init_scale: float = 2.0**16
    """Initial scale factor."""
    growth_factor: float = 2.0
    """Scale multiplier after ``growth_interval`` steps without inf/NaN gradients."""
    backoff_factor: float = 0.5
    """Scale multiplier when a step had inf/NaN gradients (that step is skipped)."""
    growth_interval: int = 2000
    """Consecutive finite steps before the scale grows."""

    def __post_init__(self) -> None:
        if self.init_scale <= 0 or self.growth_factor <= 1.0 or not 0 < self.backoff_factor < 1.0:
            raise ConfigError(
                "precision.loss_scaling needs init_scale > 0, growth_factor > 1 and "
                f"0 < backoff_factor < 1; got init_scale={self.init_scale}, "
                f"growth_factor={self.growth_factor}, backoff_factor={self.backoff_factor}"
            )
        if self.growth_interval < 1:
            raise ConfigError(
                f"precision.loss_scaling.growth_interval={self.growth_interval} must be >= 1"
            )


@dataclass
class GradHealthConfig:
    """Gradient health callback (:class:`rocmtrain.precision.grad_health.GradHealthCallback`)."""

    enabled: bool = True
    """Add the callback to the trainer."""
    log_every_n_steps: int = 50
    """Log per-group grad norms every N optimizer steps (NaN/Inf checks: ``check_every_n_steps``)."""
    on_nonfinite: str = "skip_step"
    """What a NaN/Inf gradient does: ``log`` (log and step anyway), ``skip_step`` (zero the grads and
    skip ``optimizer.step``), ``raise`` (stop the run with the parameter name and step)."""
    check_every_n_steps: int = 1
    """Read the NaN/Inf result on the host every N optimizer steps. Each check costs one
    device->host sync; between checks the grads are still checked on the device every step, but
    with N > 1 a non-finite step between checks is only counted and reported (warning with the count
    and first step) at the next check, NOT skipped: ``skip_step`` and ``raise`` act only on check
    steps, and only a check step names the parameter. 1 = check (and skip) every step. GPU
    throughput recipes set N to their log interval."""

    def __post_init__(self) -> None:
        _check("grad_health.on_nonfinite", self.on_nonfinite, NONFINITE_ACTIONS)
        if self.log_every_n_steps < 1:
            raise ConfigError(
                f"precision.grad_health.log_every_n_steps={self.log_every_n_steps} must be >= 1"
            )
        if self.check_every_n_steps < 1:
            raise ConfigError(
                f"precision.grad_health.check_every_n_steps={self.check_every_n_steps} must be "
                ">= 1. Set precision.grad_health.check_every_n_steps=1 to check every step, or N "
                "(e.g. the log interval) to check every N steps with one host sync each"
            )


@dataclass
class PrecisionConfig:
    """Numerics of a run: Lightning precision mode plus accumulator and BLAS policy."""

    mode: str = "32"
    """Lightning precision: ``"32"``, ``"bf16-mixed"`` or ``"16-mixed"`` (``fp32``/``bf16``/``fp16``
    are accepted and normalised)."""
    policy: SubmodulePolicy = field(default_factory=SubmodulePolicy)
    """Which submodules run under autocast in the mixed modes."""
    matmul_precision: str = "highest"
    """``torch.set_float32_matmul_precision``: ``highest`` = true fp32 GEMMs. ``high``/``medium``
    allow TF32/XF32 and are only applied together with ``allow_xf32=true``."""
    allow_xf32: bool = False
    """Opt in to TF32 (NVIDIA sm_80+) / XF32 (AMD gfx942) fp32 GEMMs: ~3x faster, error close to
    bf16 (10-bit mantissa inputs). No effect on gfx90a (no XF32) or CPU; this is logged."""
    reduced_precision_reduction: bool = False
    """``allow_fp16/bf16_reduced_precision_reduction``: let fp16/bf16 GEMMs reduce in 16 bits.
    Default off = fp32 accumulation. AMD marks these flags unsupported on ROCm (logged)."""
    blas_backend: str = "default"
    """Preferred BLAS: ``hipblaslt``/``hipblas`` (ROCm) or ``cublaslt``/``cublas`` (CUDA); names are
    aliases in PyTorch. ``default`` leaves PyTorch's choice (hipBLASLt on gfx90a/gfx942)."""
    tunableop: TunableOpConfig = field(default_factory=TunableOpConfig)
    """GEMM autotuning workflow."""
    loss_scaling: LossScalingConfig = field(default_factory=LossScalingConfig)
    """GradScaler settings for ``16-mixed``."""
    fp16_alt_impl: str = "default"
    """MI200 (gfx90a) fp16/bf16 MFMA flush fp16 denormals to zero. ``default``: PyTorch's behaviour
    (original kernels forward, denormal-safe alternate kernels backward); ``on``: alternate kernels in
    both passes; ``off``: original kernels in both passes. Sets ``ROCBLAS_INTERNAL_FP16_ALT_IMPL`` and
    ``MIOPEN_DEBUG_CONVOLUTION_ATTRIB_FP16_ALT_IMPL`` (read once, before the first GEMM)."""
    grad_health: GradHealthConfig = field(default_factory=GradHealthConfig)
    """Gradient norm / NaN checks."""

    def __post_init__(self) -> None:
        mode = str(self.mode).strip().lower()
        if mode not in _MODE_ALIASES:
            raise ConfigError(
                f"precision.mode={self.mode!r} is not valid; allowed: {', '.join(map(repr, MODES))} "
                "(aliases fp32, bf16, fp16). Pick one with precision=fp32|bf16|fp16"
            )
        self.mode = _MODE_ALIASES[mode]
        _check("matmul_precision", self.matmul_precision, MATMUL_PRECISIONS)
        _check("blas_backend", self.blas_backend, BLAS_BACKENDS)
        _check("fp16_alt_impl", self.fp16_alt_impl, FP16_ALT_IMPL)
        if self.matmul_precision != "highest" and not self.allow_xf32:
            raise ConfigError(
                f"precision.matmul_precision={self.matmul_precision!r} enables TF32/XF32 GEMMs, which "
                "is opt-in: also set precision.allow_xf32=true, or keep matmul_precision=highest"
            )
        # Hydra/OmegaConf hand nested configs as dicts when built from plain YAML: accept them.
        for name, cls in (
            ("policy", SubmodulePolicy),
            ("tunableop", TunableOpConfig),
            ("loss_scaling", LossScalingConfig),
            ("grad_health", GradHealthConfig),
        ):
            value = getattr(self, name)
            if isinstance(value, dict):
                setattr(self, name, cls(**value))
