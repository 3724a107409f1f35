"""Migration diagnostics, the offline subcommands: ``doctor`` (environment checks), ``scan``
(CUDA→HIP porting traps), ``plot`` and the tool-output parsers. See ``DIAGNOSTICS.md`` beside this
file. The training callbacks (device monitor, profiler, sync report) are in
:mod:`rocmtrain.callbacks`; their old paths here still import, with a DeprecationWarning.

    python -m rocmtrain doctor [--json]
    python -m rocmtrain doctor parse rocm-smi saved_output.txt --json
    python -m rocmtrain scan csrc/ kernels.py --format sarif
"""
