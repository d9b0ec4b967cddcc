"""The one exception type for bad input: the CLI prints its message on one line and exits with code 2."""


class UsageError(Exception):
    """Bad input from the user (a config value, a file, a model folder). Never a bug in ppo-rlhf."""


def require(condition: bool, message: str) -> None:
    """Raise UsageError(message) unless condition holds."""
    if not condition:
        raise UsageError(message)


class UserCodeFailed(UsageError):
    """A tool or environment of the user's raised, hung or returned the wrong thing during a run: the run stops, and
    its line says what it kept and how to continue once the code is fixed."""


class RunError(Exception):
    """A run that cannot go on for a reason that is neither bad input nor a bug (a full disk): the CLI prints its
    message on one line and exits with code 1."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM, with what to do next (the latest checkpoint, the command that continues): the CLI prints it
    after "interrupted" and exits with code 130 (after "terminated", 143, when SIGTERM stopped it)."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C raises KeyboardInterrupt (utils/signals.py), so that it keeps the same work."""
