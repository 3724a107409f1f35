"""Migration diagnostics: ``doctor`` (environment checks), ``scan`` (CUDA→HIP porting traps), the
device monitor / step-time callback and the profiler callback. See ``DIAGNOSTICS.md`` beside this file.

    python -m rocmtrain doctor [--json]
    python -m rocmtrain doctor parse rocm-smi saved_output.txt --json
    python -m rocmtrain scan csrc/ kernels.py --format sarif
    callbacks = rocmtrain.diagnostics.monitor.build_callbacks(cfg.monitor, run_dir, profile=cfg.profile)
"""
