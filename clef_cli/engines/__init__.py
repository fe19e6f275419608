"""Engines run a job through the one lifecycle in `clef_cli.job.lifecycle`: `local` (windows, encoding
workers, one model), `ray` (Ray Data actors across GPUs and machines) and `rehead` (the head alone
on stored hidden states)."""
