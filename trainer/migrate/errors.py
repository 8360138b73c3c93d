"""The one error of a conversion: the job cannot be converted faithfully."""

from __future__ import annotations


class Refusal(Exception):
    """The job cannot be converted faithfully: ``field`` is the v1 field, ``reason`` why."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason
