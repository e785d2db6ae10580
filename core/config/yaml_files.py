"""Configuration files' YAML, read strictly: errors name the file, and a key given twice in one
mapping is refused with both lines (PyYAML would keep the last one silently, so the first
``outboxTable:`` an operator reads would not be the one the harvester uses)."""

from __future__ import annotations

import io
from typing import Any

import yaml

from pyharvest.core.errors import ConfigError

__all__ = ["load_yaml"]


class _UniqueKeyLoader(yaml.SafeLoader):
    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # '<<:' merges; not a key of its own
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                first = seen.setdefault(key, line)
            except TypeError:  # an unhashable key: PyYAML's own error says so
                continue
            if first != line:
                raise ConfigError(
                    "", f"{key_node.start_mark.name}, line {line}: key {key!r} is given twice in one mapping "
                    f"(first on line {first}); keep one"
                )
        return super().construct_mapping(node, deep=deep)


class _Named(io.StringIO):
    """Text PyYAML names in its errors (it reads a stream's ``name``)."""

    def __init__(self, text: str, name: str) -> None:
        super().__init__(text)
        self.name = name


def load_yaml(text: str, source: str) -> Any:
    """The YAML document in ``text`` (``None`` if empty); ``source`` (a path) names it in every
    error, a :class:`ConfigError`."""
    try:
        return yaml.load(_Named(text, source), Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader
    except yaml.YAMLError as e:
        raise ConfigError("", f"{source} is not valid YAML: {e}") from None
