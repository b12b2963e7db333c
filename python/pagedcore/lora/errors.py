"""The errors of adapter handling: a bad adapter (400 / INVALID_ARGUMENT) and an unknown name (404 / NOT_FOUND)."""

from __future__ import annotations


class LoRAError(ValueError):
    """An adapter that cannot be loaded or used: the message names the file or field and the fix."""


class LoRANotFoundError(LoRAError, KeyError):
    """A request names an adapter the server does not know; the message lists the loaded ones."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""
