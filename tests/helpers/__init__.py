"""What the tests share, in one place: no test module imports another.

* :mod:`.waiting`: the one way a test waits (on a condition, with a deadline that says what
  did not happen);
* :mod:`.fixtures`: the pytest fixtures of every run (databases, the broker), loaded by
  ``tests/conftest.py``;
* fakes of the engine's ports (:mod:`.fakes`, :mod:`.group_fakes`, :mod:`.inbox.fakes`);
* the world the end-to-end tests drive: topics (:mod:`.topics`), outbox tables and writers
  (:mod:`.outbox`), reaper processes (:mod:`.reapers`), the ops server (:mod:`.ops`), the
  least-privilege tests' harvest sections and database roles (:mod:`.least_privilege`; the
  secured broker is :mod:`.fixtures.secure_kafka`), brokers
  to break (:mod:`.faults`), Spark sessions and sources (:mod:`.spark`), Django projects
  (:mod:`.django`), the source tree's imports (:mod:`.layering`);
* programs the tests start in child processes (:mod:`.stash_writer`,
  :mod:`.doc_snippets_driver`, :mod:`.spark_stream_driver`, the inbox handlers of
  :mod:`.inbox`).
"""
