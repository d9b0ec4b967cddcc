"""The one exception type for bad input: the CLI prints its message on one line and exits with code 2."""


class UsageError(Exception):
    """Bad input from the user (a config value, a file, a model folder). Never a bug in ppo-rlhf."""


def require(condition: bool, message: str) -> None:
    """Raise UsageError(message) unless condition holds."""
    if not condition:
        raise UsageError(message)
