"""What the reaper command prints for an operator to read: help without the docstrings'
reStructuredText markup, the effective configuration (``--print-config``, with ``--shards``),
and every section a mistyped one could be."""

from __future__ import annotations

import re

from tests.helpers.cli import assert_one_line_error, reaper


def test_no_help_shows_restructuredtext_markup():
    from pyharvest._cli import build_parser

    parser = build_parser()
    [sub] = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"]
    for name, command in sub.choices.items():
        text = command.format_help()
        assert "``" not in text and not re.search(r":(class|func|mod|meth|attr):`", text), (name, text)
    broker = sub.choices["broker"].format_help()
    assert "\"pip install 'pyharvest[embedded]'\"" in " ".join(broker.split())
    assert "the tests run on Apache Kafka" in " ".join(broker.split())


def test_print_config_shows_the_effective_binding_and_the_shards_flag(tmp_path):
    cfg = tmp_path / "reaper.yaml"
    cfg.write_text(f"harvest:\n  dataSource: sqlite:///{tmp_path / 'x.db'}\n  baseKafkaConfig:\n    bootstrap.servers: k:9092\n")
    printed = reaper("-f", str(cfg), "--print-config")
    assert printed.returncode == 0, printed.stderr
    assert "binding: sqlite" in printed.stdout and "binding: null" not in printed.stdout
    assert "shards: 1" in printed.stdout
    # The YAML's shards, from the command line too (a flag beside -f overrides the file).
    sharded = reaper("-f", str(cfg), "--shards", "3", "--print-config")
    assert sharded.returncode == 0 and "shards: 3" in sharded.stdout, sharded.stderr
    refused = reaper("-f", str(cfg), "--shards", "0")
    assert refused.returncode == 2 and "argument --shards: expected a whole number of at least 1" in refused.stderr


def test_a_mistyped_section_lists_every_section_it_could_be(tmp_path):
    cfg = tmp_path / "reaper.yaml"
    cfg.write_text("harvest:\n  dataSource: sqlite://\nmetric:\n  port: 9433\n")
    assert_one_line_error(reaper("-f", str(cfg)), "metric:", "did you mean 'metrics'?", "'logging', 'metrics'")
