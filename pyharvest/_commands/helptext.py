"""Docstrings as ``--help`` text: the reStructuredText markup a terminal would show as is, taken out."""

from __future__ import annotations

import re

__all__ = ["plain"]

_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")
_LITERAL = re.compile(r"``([^`]+)``")


def plain(text: str) -> str:
    """``text`` without RST markup: a literal loses its backquotes (quoted when it has spaces,
    so that a command line stays one piece), a role (``:class:`X```) becomes its name."""
    text = _ROLE.sub(lambda m: m.group(1).rsplit(".", 1)[-1], text)
    return _LITERAL.sub(_unquoted, text)


def _unquoted(found: re.Match[str]) -> str:
    literal = found.group(1)
    if " " not in literal:
        return literal
    return f'"{literal}"' if "'" in literal else f"'{literal}'"
