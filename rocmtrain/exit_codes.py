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

#: Ctrl-C (SIGINT) after the interrupt checkpoint was written (the shell's 128 + SIGINT).
INTERRUPTED = 130

#: A preemption signal arrived during start-up and training never started: ``128 + N`` (143 for
#: SIGTERM), as if the signal's default action had ended the process.
SIGNAL_BASE = 128
