"""Errors that end a run with a message for the user rather than a traceback."""
from __future__ import annotations

import signal


class ConfigError(ValueError):
    """A config key is unknown, missing or of the wrong type; the message names the key."""


class NonFiniteLossError(FloatingPointError):
    """A loss or gradient became NaN/inf; the message names the epoch, step and cases."""


class TrainingInterrupted(RuntimeError):
    """The run was asked to stop (SIGTERM or SIGINT: ``signum``) and wrote its checkpoint first."""

    def __init__(self, message: str, signum: int = signal.SIGTERM) -> None:
        super().__init__(message)
        self.signum = int(signum)
