"""Fault handling the strategy runs on every rank: hang watchdog (heartbeats off the communicator,
hang report naming the stuck rank, exit 75), two-phase process-group timeouts, preemption
(SIGTERM/SIGUSR1 → checkpoint → exit 75) and error hints. ``HANGS.md`` has the design."""
