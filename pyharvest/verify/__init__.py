"""Check what reached a topic against what was stashed in the outbox: nothing lost, nothing
reordered, nothing unexpected.

What counts as a one-off duplicate, a reorder and a loss: :mod:`~pyharvest.verify.check`.

:func:`verify` does the check in one pass over the messages (O(n) time, O(expected +
keys) memory), so it is fine for millions of messages. :func:`verify_topic` reads a whole
topic back with confluent-kafka and verifies it.

The parts: :mod:`~pyharvest.verify.identity_spec` (what identifies a record, on both sides),
:mod:`~pyharvest.verify.check` (the one-pass check), :mod:`~pyharvest.verify.report` (its
outcome) and :mod:`~pyharvest.verify.topic` (reading a topic back).

>>> report = verify([("k", "R0"), ("k", "R1"), ("k", "R2")],
...                 [("k", "R0"), ("k", "R1"), ("k", "R1"), ("k", "R2")])
>>> report.ok, report.duplicate_count
(True, 1)
"""

from pyharvest._public import publish
from pyharvest.verify.check import verify
from pyharvest.verify.identity_spec import IdentitySpec, VerifyError, expected_from_records, parse_identity
from pyharvest.verify.report import Duplicate, Reorder, VerifyReport
from pyharvest.verify.topic import verify_topic

__all__ = [
    "Duplicate",
    "IdentitySpec",
    "Reorder",
    "VerifyError",
    "VerifyReport",
    "expected_from_records",
    "parse_identity",
    "verify",
    "verify_topic",
]

publish(__name__, globals(), __all__)
