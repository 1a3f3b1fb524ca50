"""Where a dotted key of a study file stands (file:line), and the error that says so.

The study audit's messages name the file, the line, the key and the accepted form; this
finds the line of ``specsel.run.warmup`` in the TOML text, tables and dotted keys alike.
"""

from __future__ import annotations

import re

__all__ = ["Locator", "StudyError"]

_README = "see README 'The study file'"


class StudyError(ValueError):
    """A study file that fails the preflight audit."""


class Locator:
    """Finds the line of a dotted key in TOML text, for error messages."""

    def __init__(self, path: str, text: str, prefix: str) -> None:
        self.path, self.prefix = path, prefix
        self.lines = text.splitlines()

    def where(self, dotted: str) -> str:
        full = f"{self.prefix}.{dotted}" if dotted else self.prefix
        parts = full.split(".")
        table = ""
        best = None
        for number, raw in enumerate(self.lines, 1):
            line = raw.strip()
            header = re.fullmatch(r"\[+\s*([^\]]+?)\s*\]+", line)
            if header:
                table = header.group(1).replace('"', "").replace(" ", "")
                if table == full:
                    best = number
                continue
            match = re.match(r'"?([A-Za-z0-9_.-]+)"?\s*=', line)
            if not match:
                continue
            key_path = f"{table}.{match.group(1)}" if table else match.group(1)
            if key_path == full or (full.startswith(key_path + ".") and best is None):
                best = number
            elif parts[-1] in line and full.startswith(table + ".") and best is None:
                best = number
        return f"{self.path}:{best}" if best else self.path

    def error(self, dotted: str, message: str) -> StudyError:
        return StudyError(f"specsel: {self.where(dotted)}: {self.prefix}.{dotted}: {message} ({_README})")
