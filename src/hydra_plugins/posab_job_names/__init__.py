"""Registers posab's `posab_job_subdir` resolver wherever Hydra runs: Hydra imports every module below
`hydra_plugins` when it starts, before it composes a config (conf/config.yaml names multirun jobs with it;
posab.job_names)."""

import posab.job_names  # noqa: F401  (registers the resolver)
