"""Registers posab's `posab_encodings` and `posab_encodings_with_parameters` resolvers wherever Hydra runs:
Hydra imports every module below `hydra_plugins` when it starts, before it composes a config (the presets
that cover every encoding sweep them; posab.sweep_lists)."""

import posab.sweep_lists  # noqa: F401  (registers the resolvers)
