"""The one exception type that the CLI turns into a single clear line and a non-zero exit."""


class ConfigError(ValueError):
    """Bad user input: the message names the key(s) to change and what is allowed.

    Raise it for any input a user can fix (config values, paths, task files, model dirs).
    The CLI prints ``error: <message>`` on one line and exits with status 2; no traceback.
    """


class RunFailed(RuntimeError):
    """A run that cannot go on (a dead trainer, no sampler left, steps that are all non-finite).

    The message is the one line the CLI prints; the run's summary.json says ``"status": "failed"``
    and the command exits with status 1.
    """


class TrainerDied(RunFailed):
    """The trainer actor's process died (killed, OOM, a crashed node): the run restarts it from the
    newest checkpoint while ``trainer.max_restarts`` allows (rlmix.orchestration.runner.TrainerRestarts)."""
