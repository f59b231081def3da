"""Errors that reach the user as one clear line, never as a traceback.

Every problem with user input (scenario YAML, trace files, device profiles,
CLI flags) is raised as an :class:`InputError` that names *where* (file, key
or line) and *what* (the offending value).  The CLI catches ``PdsimError``
and prints ``pdsim: error: <message>`` with exit status 2.
"""
from __future__ import annotations


class PdsimError(Exception):
    """Base class of every error pdsim reports to a user without a traceback."""


class InputError(PdsimError):
    """Bad user input: a file, a key or line in it, and the offending value.

    >>> print(InputError("bad rate", file="s.yaml", key="workload.rate", value=-1))
    s.yaml: workload.rate = -1: bad rate
    """

    def __init__(self, message: str, *, file: str | None = None,
                 key: str | None = None, line: int | None = None,
                 value: object = None, has_value: bool | None = None):
        self.file, self.key, self.line, self.value = file, key, line, value
        self.reason, self.has_value = message, has_value
        super().__init__(self._text())

    def _text(self) -> str:
        file, key, line, value, has_value = self.file, self.key, self.line, self.value, self.has_value
        where = []
        if file:
            where.append(f"{file}:{line}" if line is not None else str(file))
        elif line is not None:
            where.append(f"line {line}")
        if key:
            shown = value if has_value or (has_value is None and value is not None) else None
            where.append(f"{key} = {_short(shown)}" if shown is not None else key)
        return ": ".join(where + [self.reason])

    def in_file(self, file: str) -> "InputError":
        """Name ``file`` when the error was raised without one (a scenario key found bad at run time)."""
        if not self.file and self.key and not self.key.startswith("--"):
            self.file = file
            self.args = (self._text(),)
        return self

    def __str__(self) -> str:
        return self.args[0] if self.args else self._text()


def _short(value: object, limit: int = 100) -> str:
    """``repr(value)``, cut to ``limit`` characters: a 5 MB string or an alias bomb stays one short line.

    >>> _short("x" * 1000, 20)
    "'xxxxxxxxxxxxxxxxxx... (1,002 characters)"
    """
    try:
        text = repr(value)
    except Exception:   # a hostile __repr__ (or an int too long to print) must not hide the error
        return f"<{type(value).__name__}>"
    return text if len(text) <= limit else f"{text[:limit - 1]}... ({len(text):,} characters)"


class ConfigError(InputError):
    """A scenario, plan or profile that does not validate."""


class TraceError(InputError):
    """A trace file that cannot be read: missing, malformed row, bad values."""


class SimulationInvariantError(PdsimError):
    """An internal conservation check failed (requests, tokens or KV blocks).

    This is a bug in pdsim, reported loudly instead of a silently wrong table.
    """
