"""The codes a driver's exception carries, however the driver spells them: what the
dialects' declared error codes (``Capabilities.privilege_errors``, ``lock_timeout_errors``)
are matched against."""

from __future__ import annotations

from typing import Any

__all__ = ["error_codes"]


def error_codes(error: BaseException) -> set[Any]:
    """The SQLSTATE and the error number of ``error`` (a SQLAlchemy ``DBAPIError`` or the
    driver's own exception), as the drivers spell them (``sqlstate``, ``pgcode``, ``args[0]``,
    ``args[0].code``, and the mariadb connector's ``errno``: its ``args`` hold only the message)."""
    orig = getattr(error, "orig", None) or error
    found: set[Any] = {getattr(orig, "sqlstate", None), getattr(orig, "pgcode", None), getattr(orig, "errno", None)}
    first = orig.args[0] if getattr(orig, "args", None) else None
    found.add(first if isinstance(first, int) else getattr(first, "code", None))
    return found - {None}
