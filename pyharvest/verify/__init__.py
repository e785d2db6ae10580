"""Check what reached a topic against what was stashed in the outbox: nothing lost, nothing
reordered, nothing unexpected.

The harvester promises *at-least-once, in causal order per key*. Under that promise a
record may be published more than once, but only as a *one-off duplicate*: a copy that
immediately follows the original (R0 R1 R1 R2, or R0 R1 R1 R1 R2). A record that reappears
after a later record of its key was seen (R0 R1 R2 R1, or the replay R0 R1 R2 R0 R1 R2) is
a *reorder*, as is plain R0 R2 R1; MP/R's per-key in-flight barrier exists to make these
impossible. A record that never arrives is *lost* (R0 R2 with R1 missing is a loss, not a
reorder). See goharvest's FAQ, "Why throttle in-flight records by key?".

:func:`verify` does the check in one pass over the messages (O(n) time, O(expected +
keys) memory), so it is fine for millions of messages. :func:`verify_topic` reads a whole
topic back with confluent-kafka and verifies it.

The parts: :mod:`~pyharvest.verify.identity` (what identifies a record, on both sides),
:mod:`~pyharvest.verify.check` (the one-pass check), :mod:`~pyharvest.verify.report` (its
outcome) and :mod:`~pyharvest.verify.topic` (reading a topic back).

>>> report = verify([("k", "R0"), ("k", "R1"), ("k", "R2")],
...                 [("k", "R0"), ("k", "R1"), ("k", "R1"), ("k", "R2")])
>>> report.ok, report.duplicate_count
(True, 1)
"""

from pyharvest.verify.check import verify
from pyharvest.verify.identity import IdentitySpec, VerifyError, expected_from_records, parse_identity
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
