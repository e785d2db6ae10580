"""Generate the configuration reference from the config classes, so it cannot drift.

Keys, Python attributes, types and defaults come from the dataclasses themselves
(:class:`~pyharvest.Config`, ``Limits``, ``LoggingConfig`` and the ``metrics:``
section's ``OpsConfig``); the environment variable of each key from
:mod:`pyharvest.envconfig`'s naming. Descriptions come from the tables of
``docs/configuration.md`` (``harvest:`` and ``limits:``), from ``OpsConfig``'s docstring
and, for ``logging:``, from the table below. A key without a description fails the build.

The page is stored in the repository, so that links to it work where the docs are read as
files; ``docs/hooks.py`` checks during ``mkdocs build``, and ``tests/test_envconfig.py`` in
the tests, that it is what the classes give. After changing a key, write it again::

    python docs/gen_config_reference.py --write
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import re
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

DOCS = Path(__file__).resolve().parent
PAGE = "reference/configuration.md"

LOGGING_DESCRIPTIONS = {
    "level": "log level: `Trace`, `Debug`, `Info`, `Warn`, `Error` or `Off` (goharvest's names, any case).",
    "json": "`true` writes one JSON object per log line (time, level, logger, message, exception).",
}

# Defaults that depend on the machine or on other keys: the computed value would mislead.
DERIVED = {
    ("harvest", "leaderTopic"),
    ("harvest", "leaderGroupID"),
    ("harvest", "name"),
    ("harvest", "dataSource"),
    ("harvest", "binding"),
    ("harvest.limits", "maxPollInterval"),
    ("harvest.limits", "drainInterval"),
}


class DriftError(RuntimeError):
    """The classes and the documentation disagree."""


def _doc_tables(path: Path) -> dict[str, dict[str, tuple[str, str]]]:
    """``{heading: {key: (default, meaning)}}`` from the key tables of a Markdown page."""
    tables: dict[str, dict[str, tuple[str, str]]] = {}
    heading = ""
    row = re.compile(r"^\|\s*`([A-Za-z0-9_.]+)`\s*\|(.*)\|(.*)\|\s*$")
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
            continue
        m = row.match(line)
        if m:
            tables.setdefault(heading, {})[m.group(1)] = (m.group(2).strip(), m.group(3).strip())
    return tables


def _table_for(tables: dict[str, dict[str, tuple[str, str]]], section: str) -> dict[str, tuple[str, str]]:
    for heading, rows in tables.items():
        if f"`{section}:`" in heading:
            return rows
    return {}


def _google_attributes(doc: str | None) -> dict[str, str]:
    """The ``Attributes:`` entries of a Google-style docstring."""
    out: dict[str, str] = {}
    if not doc:
        return out
    lines = doc.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == "Attributes:")
    except StopIteration:
        return out
    current = None
    for line in lines[start + 1:]:
        if not line.strip():
            if current is not None:
                current = None
            continue
        m = re.match(r"^\s{4,8}(\w+):\s*(.*)$", line)
        if m and len(line) - len(line.lstrip()) <= 8:
            current = m.group(1)
            out[current] = m.group(2).strip()
        elif current is not None:
            out[current] += " " + line.strip()
        else:
            break
    return out


def _type_name(tp: Any, attr: str, durations: set[str]) -> str:
    if attr in durations:
        return "duration"
    choices = [a for a in typing.get_args(tp) if isinstance(a, type) and issubclass(a, enum.Enum)]
    if choices:  # a str enum, or the string a YAML file writes
        return "one of " + ", ".join(f"`{m.value}`" for m in choices[0])
    text = tp if isinstance(tp, str) else getattr(tp, "__name__", str(tp))
    text = text.replace(" | None", "")
    names = {"str": "string", "int": "integer", "float": "number", "bool": "boolean", "dict": "mapping"}
    return names.get(text, "mapping" if text.startswith("dict") else text)


def _yaml_value(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, dict):
        inner = ", ".join(f"{k}: {v}" for k, v in value.items())
        return f"`{{{inner}}}`"
    return f"`{value}`"


def _env_name(path: tuple[str, ...]) -> str:
    return "PYHARVEST_" + "__".join(p.upper() for p in path)


@dataclasses.dataclass
class Row:
    key: str
    attribute: str
    type: str
    default: str
    meaning: str
    env: str


def _rows() -> Iterator[tuple[str, str, list[Row]]]:
    from pyharvest.bindings.ops.config import METRICS_KEYS, OpsConfig
    from pyharvest.core.config.settings import Config, Limits, LoggingConfig
    from pyharvest.core.config.durations import format_duration

    tables = _doc_tables(DOCS / "configuration.md")
    missing: list[str] = []

    def describe(section: str, key: str, sources: list[Callable[[str], str | None]]) -> str:
        for source in sources:
            text = source(key)
            if text:
                return text
        missing.append(f"{section}.{key}")
        return "*undocumented*"

    def from_table(section: str) -> Callable[[str], str | None]:
        rows = _table_for(tables, section)
        return lambda key: rows[key][1] if key in rows else None

    def documented_default(section: str, key: str) -> str | None:
        rows = _table_for(tables, section.rsplit(".", 1)[-1])
        return rows[key][0] if key in rows else None

    # harvest:
    resolved = Config(name="x", leader_group_id="x").resolve()
    keys = list(Config().to_mapping(mask_secrets=False))
    attr_of = {key: f.name for key, f in zip(keys, dataclasses.fields(Config), strict=True)}
    # The names the annotations use are those of the module the classes are written in (their
    # __module__ is their public path, whose namespace need not hold them all).
    written_in = vars(importlib.import_module("pyharvest.core.config.settings"))
    hints = typing.get_type_hints(Config, written_in)
    rows: list[Row] = []
    for key in keys:
        attr = attr_of[key]
        if key == "limits":
            continue
        value = getattr(resolved, attr)
        default = documented_default("harvest", key) if ("harvest", key) in DERIVED else None
        rows.append(Row(
            key, attr, _type_name(hints[attr], attr, set()),
            default or _yaml_value(value),
            describe("harvest", key, [from_table("harvest")]),
            _env_name(("harvest", key)) + ("__<PROPERTY>" if key.endswith("KafkaConfig") else ""),
        ))
    yield "harvest", "The `harvest:` section (goharvest's, unchanged): `pyharvest.Config`.", rows

    # harvest.limits:
    limits = Limits().resolve()
    lim_hints = typing.get_type_hints(Limits, written_in)
    durations = {f.name for f in dataclasses.fields(Limits) if lim_hints[f.name] == (float | None)}
    lim_keys = list(limits.to_mapping())
    rows = []
    for key, f in zip(lim_keys, dataclasses.fields(Limits), strict=True):
        value = getattr(limits, f.name)
        shown = _yaml_value(format_duration(value) if f.name in durations else value)
        if ("harvest.limits", key) in DERIVED:
            shown = f"{documented_default('harvest.limits', key) or ''} ({shown} by default)".strip()
        rows.append(Row(
            key, f.name, _type_name(lim_hints[f.name], f.name, durations), shown,
            describe("harvest.limits", key, [from_table("limits")]),
            _env_name(("harvest", "limits", key)),
        ))
    yield (
        "harvest.limits",
        "Timing and sizing: `pyharvest.Limits`. Durations take Go's form, with a unit (`500ms`, `1s`, `1m30s`); "
        "a bare number other than `0` is refused. In Python, `Limits` takes seconds as floats.",
        rows,
    )

    # logging:
    log_defaults = LoggingConfig()
    rows = [
        Row(f.name, f.name, _type_name(f.type, f.name, set()), _yaml_value(getattr(log_defaults, f.name)),
            describe("logging", f.name, [LOGGING_DESCRIPTIONS.get]), _env_name(("logging", f.name)))
        for f in dataclasses.fields(LoggingConfig)
    ]
    yield "logging", "The `logging:` section: `pyharvest.envconfig.LoggingConfig`.", rows

    # metrics:
    ops_defaults = OpsConfig()
    ops_docs = {k: v.replace("``", "`") for k, v in _google_attributes(OpsConfig.__doc__).items()}
    ops_attr = {"address": "address", "port": "port", "backlogInterval": "backlog_interval", "enabled": "enabled",
                "ageInterval": "age_interval"}
    if set(ops_attr) != set(METRICS_KEYS):
        raise DriftError(f"metrics keys changed: {sorted(METRICS_KEYS)}; update ops_attr in {__file__}")
    ops_hints = typing.get_type_hints(OpsConfig)
    rows = []
    for key in METRICS_KEYS:
        attr = ops_attr[key]
        value = getattr(ops_defaults, attr)
        rows.append(Row(
            key, attr, _type_name(ops_hints[attr], attr, {"backlog_interval", "age_interval"}),
            "— (no backlog gauge)" if key == "backlogInterval"
            else _yaml_value(format_duration(value) if key == "ageInterval" else value),
            describe("metrics", key, [lambda _key, a=attr: ops_docs.get(a)]),
            _env_name(("metrics", key)),
        ))
    yield (
        "metrics",
        (
            "The `metrics:` section: the operations server (`/metrics`, `/healthz`, `/readyz`); "
            "present means on. See [Operations](../operations.md)."
        ),
        rows,
    )

    if missing:
        raise DriftError(
            f"configuration keys without a description: {', '.join(missing)} "
            "(add a row to docs/configuration.md, or a docstring entry)"
        )


def render() -> str:
    """The Markdown page."""
    out = [
        "# Configuration reference",
        "",
        "<!-- Generated by docs/gen_config_reference.py from the config classes: do not edit. -->",
        "",
        "Every key of `reaper.yaml`, generated from the classes that read it. The",
        "[configuration guide](../configuration.md) explains them with examples. Each key can also be",
        "set from the environment (see [below](#environment-variables)); the variable is shown",
        "in upper case, but segments match any case and may use `_` between words",
        "(`MAX_IN_FLIGHT_RECORDS`).",
        "",
    ]
    for section, intro, rows in _rows():
        out += [f"## `{section}:`", "", intro, "", "| key | Python | type | default | meaning | environment variable |",
                "|---|---|---|---|---|---|"]
        for r in rows:
            meaning = r.meaning.replace("|", "\\|")
            out.append(f"| `{r.key}` | `{r.attribute}` | {r.type} | {r.default} | {meaning} | `{r.env}` |")
        out.append("")
    from pyharvest import envconfig

    doc = envconfig.__doc__ or ""
    body = doc.split("\n\n", 1)[1] if "\n\n" in doc else doc
    body = body.split("Apply :func:")[0].rstrip()
    out += ["## Environment variables", "", _rst_to_md(body), ""]
    return "\n".join(out)


def _rst_to_md(text: str) -> str:
    """Just enough reStructuredText for envconfig's docstring: ``literal`` and ``::`` blocks."""
    out: list[str] = []
    block: list[str] | None = None
    for line in text.splitlines():
        if block is not None:
            if line.strip() and not line.startswith("    "):
                out += ["```sh", *_strip_blank(block), "```", ""]
                block = None
            else:
                block.append(line[4:])
                continue
        if line.rstrip().endswith("::"):
            out += [line.rstrip()[:-2].rstrip() + ":", ""]
            block = []
            continue
        out.append(line.replace("``", "`"))
    if block is not None:
        out += ["```sh", *_strip_blank(block), "```"]
    return "\n".join(out)


def _strip_blank(lines: list[str]) -> list[str]:
    while lines and not lines[0].strip():
        lines = lines[1:]
    while lines and not lines[-1].strip():
        lines = lines[:-1]
    return lines


def stored_page_problem() -> str | None:
    """Why the page stored in the repository (``docs/reference/configuration.md``, so that links
    to it work outside the built site too) differs from what the classes give, or None."""
    stored = DOCS / PAGE
    if not stored.exists():
        return f"docs/{PAGE} is missing"
    if stored.read_text(encoding="utf-8") != render() + "\n":
        return f"docs/{PAGE} is out of date"
    return None


if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["--write"]:
        (DOCS / PAGE).write_text(render() + "\n", encoding="utf-8")
    else:
        print(render())
