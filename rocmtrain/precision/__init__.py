"""Numerics made explicit: precision plugin and policy, fp32-intermediate atomics, precision matrix.

- :mod:`rocmtrain.precision.plugin`: ``build_precision_plugin(cfg)`` → ``Trainer(plugins=[...])``
  (32 / bf16-mixed / 16-mixed, per-submodule fp32 islands, matmul/BLAS/TunableOp/fp16-alt-impl
  settings applied, logged and restored at teardown).
- :mod:`rocmtrain.precision.atomics`: ``index_add`` / ``scatter_add`` / ``embedding_bag_grad`` that
  accumulate fp16/bf16 in fp32 and cast once (Triton on GPU, torch elsewhere).
- :mod:`rocmtrain.precision.capabilities`: per-arch atomics / XF32 / flag-support table.
- ``GradHealthCallback`` (group norms, NaN culprit, skip-step) is a training callback:
  :mod:`rocmtrain.callbacks.grad_health` (the old path here still imports, deprecated).
- :mod:`rocmtrain.precision.matrix`: ``python -m rocmtrain precision-matrix`` (+ :mod:`drift`).

Long-form notes and recorded results: ``rocmtrain/precision/PRECISION.md``. Submodules are imported
on use; importing this package is cheap.
"""
