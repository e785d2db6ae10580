"""A user's mistake mypy must catch against the installed wheel: proof that the types are
read from the package (``py.typed``), not taken as ``Any``."""

from __future__ import annotations

import sqlalchemy as sa

from pyharvest import stasher


def stash_a_string(engine: sa.Engine) -> None:
    with engine.begin() as tx:
        stasher.stash(tx, "not a record")
