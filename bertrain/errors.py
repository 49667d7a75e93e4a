"""Errors users can act on. The CLI turns each into a one-paragraph message and an exit code."""

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_REQUEUE = 75
EXIT_CTRL_C = 130  # 128 + SIGINT: stopped by Ctrl-C (pretrain saved a checkpoint first)


class BertrainError(Exception):
    """An error with a message meant for the user; no traceback is shown unless --debug."""

    exit_code = EXIT_ERROR


class ConfigError(BertrainError):
    """Bad config file, unknown key, wrong type or bad override: exit code 2."""

    exit_code = EXIT_USAGE


class UsageError(BertrainError):
    """Bad command-line usage: exit code 2."""

    exit_code = EXIT_USAGE


class DataError(BertrainError):
    """Bad or missing input data (a file, line or record is named in the message)."""


class TrainingDiverged(DataError):
    """train.max_bad_steps non-finite steps in a row: a run's record says so by this name, not as bad data."""


class Interrupted(BertrainError):
    """Stopped by a signal: by default after a checkpoint was written, exit 75 so a job script can requeue."""

    def __init__(self, message: str, exit_code: int = EXIT_REQUEUE) -> None:
        super().__init__(message)
        self.exit_code = exit_code
