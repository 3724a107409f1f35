"""rccl-tests / nccl-tests wrapper: ``parser`` (text, JSON, CSV → rows + per-size health), ``runner``
(find binaries, argument lists, process-group timeouts), ``sweep`` (settings × sizes → table, plot,
preset) and ``cli`` (``python -m rocmtrain rccl-tests parse|run|sweep``). See ``comms/RCCL.md``."""
