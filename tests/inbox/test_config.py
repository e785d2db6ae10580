"""Inbox configuration, messages and the CLI's handler loading: no database, no broker."""

from __future__ import annotations

import pytest

from pyharvest._commands.inbox import load_handler
from pyharvest.core.errors import ConfigError
from pyharvest.inbox import InboxConfig, InboxFile, delivery_id_for, source_identity

BASE = {
    "baseKafkaConfig": {"bootstrap.servers": "k:9092"},
    "groupID": "billing",
    "topics": ["orders"],
    "dataSource": "postgresql+psycopg://app:s3cret@db/app",
}


def test_yaml_section_loads_with_durations_and_defaults():
    c = InboxConfig.from_mapping(
        {**BASE, "errorPolicy": "dead-letter", "limits": {"maxBatchSize": 50, "maxBatchDuration": "250ms"}}
    ).resolve()
    assert c.limits.max_batch_size == 50 and c.limits.max_batch_duration == 0.25
    assert c.error_policy == "dead-letter" and c.checkpoint_table == "pyharvest_inbox_checkpoint"
    assert "s3cret" not in repr(c)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"groupID": ""}, "inbox.groupID"),
        ({"topics": []}, "inbox.topics"),
        ({"topics": ["bad topic"]}, "inbox.topics"),
        ({"errorPolicy": "skip"}, "inbox.errorPolicy"),
        ({"checkpointTable": "x; drop table y"}, "inbox.checkpointTable"),
        (
            {"baseKafkaConfig": {"bootstrap.servers": "k", "enable.auto.commit": True}},
            "inbox.baseKafkaConfig.enable.auto.commit",
        ),
        ({"baseKafkaConfig": {}}, "inbox.baseKafkaConfig"),
        ({"dedupeWindow": 0}, "inbox.dedupeWindow"),
        ({"limits": {"maxBatchSize": 0}}, "inbox.limits.maxBatchSize"),
        ({"limits": {"maxBatchDuration": "soon"}}, "inbox.limits.maxBatchDuration"),
        ({"limits": {"batchSize": 3}}, "inbox.limits.batchSize"),
        ({"bogus": 1}, "inbox.bogus"),
    ],
)
def test_bad_values_name_their_field(change, field):
    with pytest.raises(ConfigError) as e:
        InboxConfig.from_mapping({**BASE, **change}).resolve()
    assert field in str(e.value)


def test_file_needs_an_inbox_section_and_tolerates_a_harvest_one():
    with pytest.raises(ConfigError, match="inbox"):
        InboxFile.from_mapping({"harvest": {}})
    f = InboxFile.from_mapping({"inbox": BASE, "harvest": {"leaderGroupID": "x"}, "logging": {"level": "Debug"}})
    assert f.inbox.group_id == "billing" and f.logging.level == "Debug"


def test_source_identity_and_delivery_id():
    headers = (("pyharvest-outbox", b"svc/outbox"), ("pyharvest-record-id", b"42"))
    assert source_identity(headers) == ("svc/outbox", 42)
    assert source_identity((("pyharvest-outbox", b"svc/outbox"), ("pyharvest-record-id", b"x"))) is None
    assert source_identity(()) is None
    # The same record at another offset (a republished copy): the same delivery id.
    assert delivery_id_for("g", "t", 0, 5, ("svc/outbox", 42)) == delivery_id_for("g", "t", 3, 99, ("svc/outbox", 42))
    assert delivery_id_for("g", "t", 0, 5, None) != delivery_id_for("g", "t", 0, 6, None)
    assert delivery_id_for("g", "t", 0, 5, None) != delivery_id_for("h", "t", 0, 5, None)
    assert len(delivery_id_for("g", "t", 0, 5, None)) == 32


def test_load_handler():
    assert load_handler("tests.helpers.inbox.chain_handler:apply").__name__ == "apply"
    for bad in (
        "nocolon",
        "no_such_module_xyz:f",
        "tests.helpers.inbox.chain_handler:missing",
        "tests.helpers.inbox.chain_handler:PREFIX",
    ):
        with pytest.raises(ConfigError, match="--handler"):
            load_handler(bad)


def test_cli_prints_config_masked_and_refuses_bad_config(tmp_path, capsys):
    import yaml

    from pyharvest._commands.inbox import main

    good = tmp_path / "inbox.yaml"
    good.write_text(yaml.safe_dump({"inbox": BASE}))
    assert main(["-f", str(good), "--print-config"]) == 0
    out = capsys.readouterr().out
    assert "groupID: billing" in out and "s3cret" not in out
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"inbox": {**BASE, "errorPolicy": "ignore"}}))
    assert main(["-f", str(bad), "--handler", "tests.helpers.inbox.chain_handler:apply"]) == 2
    assert "inbox.errorPolicy" in capsys.readouterr().err


def test_cli_reports_an_unexpected_error_in_one_line_as_reaper_inbox_does(tmp_path, capsys):
    import yaml

    from pyharvest._commands.inbox import main

    cfg = tmp_path / "inbox.yaml"
    cfg.write_text(yaml.safe_dump({"inbox": {**BASE, "dataSource": f"sqlite:///{tmp_path}/no/such/dir/inbox.db"}}))
    assert main(["-f", str(cfg), "--init-db"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("reaper: error: OperationalError:") and err.count("\n") == 1


def test_cli_takes_one_of_handler_and_batch_handler(tmp_path, capsys):
    import yaml

    from pyharvest._commands.inbox import main

    cfg = tmp_path / "inbox.yaml"
    cfg.write_text(yaml.safe_dump({"inbox": BASE}))
    both = ["--handler", "tests.helpers.inbox.chain_handler:apply", "--batch-handler", "tests.helpers.inbox.batch_handler:apply"]
    for args in ([], both):
        assert main(["-f", str(cfg), *args]) == 2
        assert "--batch-handler" in capsys.readouterr().err
    assert main(["-f", str(cfg), "--batch-handler", "tests.helpers.inbox.batch_handler:nothing"]) == 2
    assert "--batch-handler" in capsys.readouterr().err, "the error names the option given"


def test_inbox_takes_one_of_handler_and_batch_handler():
    from pyharvest.inbox import Inbox

    config = InboxConfig.from_mapping(BASE)
    with pytest.raises(TypeError, match="not both"):
        Inbox(config, lambda tx, m: None, batch_handler=lambda tx, ms: None)
    with pytest.raises(TypeError, match="not neither"):
        Inbox(config)
    with pytest.raises(TypeError, match="batch_handler must be callable"):
        Inbox(config, batch_handler="apply_all")  # type: ignore[arg-type]


def test_build_message_is_the_constructor_without_its_cost():
    import dataclasses

    from pyharvest.core.inbox.message import build_message
    from pyharvest.inbox import InboxMessage

    values = ("t", 3, 17, b"k", b"v", (("h", b"x"),), 1_700_000_000_000, ("o/outbox", 9), "d" * 32)
    built = build_message(*values)
    assert built == InboxMessage(*values) and hash(built) == hash(InboxMessage(*values))
    assert dataclasses.astuple(built) == values
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.offset = 18  # type: ignore[misc]
