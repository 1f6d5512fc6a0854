"""What a battery found: one row per check, and the error that fails a test."""

from __future__ import annotations

import math
import traceback
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["BatteryFailure", "Check", "Report", "describe"]


class BatteryFailure(AssertionError):
    """A battery with failed checks; ``report`` holds every check, passed or not."""

    def __init__(self, report: Report):
        super().__init__(report.failure_message())
        self.report = report


@dataclass
class Check:
    """One check of a battery: its name, device and subject (a blob, a state, a setting),
    whether it passed, its worst error, where that error is and a hint at the usual cause."""

    name: str
    device: str
    subject: str
    passed: bool
    worst: float = float("nan")
    detail: str = ""
    hint: str = ""

    @classmethod
    def raised(cls, name: str, device: str, subject: str, error: BaseException) -> Check:
        """The check ``name`` that could not finish because ``error`` was raised: failed,
        the error its finding, named with the line that raised it, and no hint (the usual
        cause of a wrong result is not why a check raised).

        >>> try:
        ...     {}["fh_t2"]
        ... except KeyError as e:
        ...     check = Check.raised("cont: state reset at cont 0", "cpu", "forward", e)
        >>> check.passed, check.hint, check.detail.split(" (at ")[0]
        (False, '', "raised KeyError: 'fh_t2'")
        """
        return cls(name, device, subject, False, float("inf"), f"raised {describe(error)}")

    def line(self) -> str:
        worst = "-" if math.isnan(self.worst) else f"{self.worst:.2e}"
        return (f"{'PASS' if self.passed else 'FAIL'}  {self.device:<6} {self.name:<34} "
                f"{self.subject:<40} {worst:>9}")


def describe(error: BaseException) -> str:
    """``error``'s type and message, and the file, line and function that raised it (or
    the error it was raised from: a NetError names the layer, its cause the line)."""
    origin = error
    while origin.__cause__ is not None:
        origin = origin.__cause__
    frames = traceback.extract_tb(origin.__traceback__)
    where = (f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno} in "
             f"{frames[-1].name})" if frames else "")
    return f"{type(error).__name__}: {error}{where}"


@dataclass
class Report:
    """The checks a battery ran on ``subject``, in order.

    ``str(report)`` is the table; :meth:`raise_on_failure` raises
    :class:`BatteryFailure` (an AssertionError) naming every failed check.

    >>> r = Report("layer 'l' (TanH)")
    >>> r.add(Check("forward vs reference", "cpu", "top 0", True, 0.0))
    >>> r.passed, len(r.checks)
    (True, 1)
    """

    subject: str
    checks: list[Check] = field(default_factory=list)
    seconds: float = 0.0

    def add(self, check: Check) -> None:
        self.checks.append(check)

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if not c.passed]

    def caught_by(self) -> list[str]:
        """The names of the failed checks, each once, in order."""
        return list(dict.fromkeys(c.name for c in self.failures))

    def worst(self, name: str) -> float:
        """The worst error of the failed checks called ``name`` (nan if none failed)."""
        errors = [c.worst for c in self.failures if c.name == name]
        return max(errors, key=lambda e: -1 if math.isnan(e) else e) if errors else float("nan")

    def table(self) -> str:
        head = f"{'':4}  {'device':<6} {'check':<34} {'subject':<40} {'worst err':>9}"
        lines = [f"battery of {self.subject}: {len(self.checks) - len(self.failures)} of "
                 f"{len(self.checks)} checks pass ({self.seconds:.2f} s)", head]
        lines += [c.line() for c in self.checks]
        return "\n".join(lines)

    def failure_message(self) -> str:
        lines = [f"battery of {self.subject}: {len(self.failures)} of {len(self.checks)} "
                 f"checks fail"]
        for c in self.failures:
            lines.append(f"- {c.name} [{c.device}] {c.subject}: {c.detail}")
            if c.hint:
                lines.append(f"  hint: {c.hint}")
        return "\n".join(lines)

    def raise_on_failure(self) -> Report:
        """Raise :class:`BatteryFailure` if any check failed; else return the report."""
        if not self.passed:
            raise BatteryFailure(self)
        return self

    def __str__(self) -> str:
        return self.table()
