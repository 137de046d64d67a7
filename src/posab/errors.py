"""User-facing errors."""


class ConfigError(ValueError):
    """A setting or input is invalid; the message names it, its value and what would be valid."""


class TrainingError(RuntimeError):
    """Training cannot go on (a NaN or infinite loss); the last good checkpoint is kept."""


class Preempted(RuntimeError):
    """SIGTERM or SIGINT arrived; a checkpoint was saved and the run can be resumed by rerunning it."""

    exit_code = 3
