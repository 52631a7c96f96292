"""Errors that end a run with a message for the user rather than a traceback."""
from __future__ import annotations


class ConfigError(ValueError):
    """A config key is unknown, missing or of the wrong type; the message names the key."""


class NonFiniteLossError(FloatingPointError):
    """A loss or gradient became NaN/inf; the message names the epoch, step and cases."""


class TrainingInterrupted(RuntimeError):
    """The run was asked to stop (SIGTERM) and wrote its checkpoint first."""
