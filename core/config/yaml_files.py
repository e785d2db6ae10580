"""Configuration files: their YAML, read strictly (errors name the file, and a key given twice
in one mapping is refused with both lines: PyYAML would keep the last one silently, so the
first ``outboxTable:`` an operator reads would not be the one the harvester uses), and their
top-level sections, checked in the file's order with every section's errors named by full path."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import yaml

from pyharvest.core.config.mapping import did_you_mean
from pyharvest.core.errors import ConfigError

__all__ = [
    "FILE_SECTIONS",
    "SectionCheck",
    "check_file_sections",
    "file_sections",
    "load_yaml",
    "read_yaml_file",
    "section_errors",
]


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


#: The top-level sections of a configuration file. One file may serve several commands: each
#: reads its own section and ``logging:``, and leaves the others to theirs.
FILE_SECTIONS = frozenset({"harvest", "inbox", "logging", "metrics"})


def file_sections(data: object, section: str) -> Mapping[str, Any]:
    """``data``, the YAML document of a configuration file read for its ``section:``, once checked
    to be a mapping of known sections."""
    if not isinstance(data, Mapping):
        article = "an" if section[0] in "aeiou" else "a"
        raise ConfigError("", f"the configuration file must hold a mapping with {article} '{section}:' section")
    unknown = set(data) - FILE_SECTIONS
    if unknown:
        first = sorted(unknown, key=str)[0]
        others = ", ".join(f"'{s}'" for s in sorted(FILE_SECTIONS - {section}))
        raise ConfigError(
            str(first),
            f"unknown top-level section; {did_you_mean(first, FILE_SECTIONS)}expected '{section}' and optionally "
            f"{others}",
        )
    return data


#: Reads (and so checks) one section of a configuration file; raises :class:`ConfigError`.
SectionCheck = Callable[[Any], object]


def check_file_sections(data: Mapping[str, Any], checks: Mapping[str, SectionCheck], required: str) -> None:
    """Check every section of a configuration file that ``checks`` knows, in the file's order,
    and report all their errors at once (each section's first), in that order, then a missing
    ``required`` section: a file whose ``metrics:`` is wrong and which has no ``harvest:``
    says both, ``metrics:`` first, rather than one, then the other on the next run. One
    :class:`ConfigError`, named by the first error's field (``metrics.port``)."""
    errors: list[ConfigError] = []
    for section, body in data.items():
        check = checks.get(section)
        if check is None:
            continue
        try:
            with section_errors(section):
                check(body)
        except ConfigError as e:
            errors.append(e)
    if required not in data:
        article = "an" if required[0] in "aeiou" else "a"
        errors.append(
            ConfigError(required, f"missing section; the configuration file needs {article} '{required}:' mapping")
        )
    if errors:
        first, *others = errors
        raise ConfigError(first.field, "; also ".join([first.problem, *(str(e) for e in others)]))


def read_yaml_file(path: str) -> Any:
    """The YAML document in ``path`` (``{}`` if empty), with one-line errors for a missing file
    or bad YAML."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise ConfigError("", f"cannot read configuration file {path!r}: {e.strerror}") from None
    data = load_yaml(text, path)
    return data if data is not None else {}


@contextlib.contextmanager
def section_errors(prefix: str) -> Iterator[None]:
    """Checks of the ``prefix:`` section of a file name the full path in their errors
    (``harvest.shards``), as the file's own readers do, not the field alone."""
    try:
        yield
    except ConfigError as e:
        if not e.field or e.field == prefix or e.field.startswith(f"{prefix}."):
            raise
        raise ConfigError(f"{prefix}.{e.field}", e.problem) from None
