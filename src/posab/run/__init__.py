"""A run and what it writes, in four rooms: `wiring` (config -> data -> model -> training -> evaluations
-> results; and re-evaluating a finished run), `directory` (the run directory: checkpoints, resuming, a
finished run kept), `evaluations` (the evaluations around the passkey stage and their files) and
`summary` (the end-of-run table; needs no torch). Import the rooms."""
