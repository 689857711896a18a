"""A run's plumbing: what a run writes and where (rundir, metadata), how it resumes after a restart (resume), what
else ran beside it (conditions), how it reports (progress, logs), the front doors' one-line errors (cli) and the
SLURM cluster it may run on (slurm). Modules are imported by their own names; this file holds no code."""
