"""Process exit codes rocmtrain uses, documented in one place for Slurm scripts and operators.

A rank that exits with :data:`REQUEUE` asks its batch script to requeue the job
(``scontrol requeue $SLURM_JOB_ID``); the requeued job resumes from the last checkpoint.
"""

OK = 0
#: generic failure that a requeue will not fix (bad config, code error)
FAILURE = 1
#: bad command line / configuration (argparse and config errors)
USAGE = 2
#: EX_TEMPFAIL: hang detected by the watchdog, or preempted (SIGTERM/SIGUSR1) after a checkpoint.
#: Requeue the job; it resumes from the last good checkpoint.
REQUEUE = 75
