"""User-facing errors."""


class ConfigError(ValueError):
    """A setting or input is invalid; the message names it, its value and what would be valid."""


class TrainingError(RuntimeError):
    """Training cannot go on (a NaN or infinite loss); the last good checkpoint is kept."""


class Preempted(RuntimeError):
    """SIGTERM or SIGINT arrived; a checkpoint was saved and the run can be resumed by rerunning it."""

    exit_code = 3


def require(condition: bool, message: str) -> None:
    """Raise a ConfigError with `message` unless `condition` holds."""
    if not condition:
        raise ConfigError(message)


def require_positive(section: str, owner: object, names: tuple[str, ...]) -> None:
    """Each named integer field of `owner` (a config dataclass) is > 0; the message names `section.field`."""
    for name in names:
        value = getattr(owner, name)
        require(value > 0, f"{section}.{name}={value} must be a positive integer")
