"""User-facing errors."""


class ConfigError(ValueError):
    """A setting or input is invalid; the message names it, its value and what would be valid."""
