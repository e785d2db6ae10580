"""pyharvest: a transactional outbox relay from SQL databases to Kafka.

Write records as rows of an outbox table inside your own transactions; run a harvester (or
the ``reaper`` command) to publish them to Kafka in causal order per key, at least once or
exactly once, with one leader at a time among any number of processes::

    from pyharvest import Config, Harvest, OutboxRecord, stasher

    with engine.begin() as tx:                       # your SQLAlchemy transaction
        stasher.stash(tx, OutboxRecord("orders", key="order-42", value=b"..."))

    config = Config(base_kafka_config={"bootstrap.servers": "localhost:9092"},
                    data_source="postgresql+psycopg://app@localhost/app")
    with Harvest(config, on_event=print) as harvest:
        harvest.join()

Here: :class:`Harvest`, its :class:`Config` and :class:`Limits`, the choices a config names
(:class:`Delivery`, :class:`PoisonPolicy`, :class:`GroupProtocol`) and :class:`OutboxRecord`.
Each of the rest has one public module:

* :mod:`pyharvest.stasher`: write records (``stash``, ``astash``, ``Stasher``);
* :mod:`pyharvest.events`: what a harvester reports (its events, ``State``, ``Health``);
* :mod:`pyharvest.errors`: the exceptions to catch;
* :mod:`pyharvest.inbox`: apply Kafka messages to a database exactly once;
* :mod:`pyharvest.verify`: check a topic against what was stashed;
* :mod:`pyharvest.envconfig`: ``reaper.yaml`` and ``PYHARVEST_*`` overrides;
* :mod:`pyharvest.tracing`, :mod:`pyharvest.testing` (a dialect's conformance kit),
  :mod:`pyharvest.django`, :mod:`pyharvest.alembic`.

Integrations build on :mod:`pyharvest.bindings` (SQL, Kafka, Spark, metrics), dialect plugins on
:mod:`pyharvest.plugins.api` (one per kind of database); :mod:`pyharvest.core` is the engine itself.
"""

from pyharvest import errors, events  # noqa: F401 - each names its classes' public path at import
from pyharvest._harvest import Harvest
from pyharvest._public import publish
from pyharvest._version import __version__
from pyharvest.core.config.choices import Delivery, GroupProtocol, PoisonPolicy
from pyharvest.core.config.settings import Config, Limits
from pyharvest.core.outbox.records import OutboxRecord

__all__ = [
    "Config",
    "Delivery",
    "GroupProtocol",
    "Harvest",
    "Limits",
    "OutboxRecord",
    "PoisonPolicy",
    "__version__",
]

publish(__name__, globals(), __all__)
