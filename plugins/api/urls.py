"""Data-source strings: libpq ``key=value`` DSNs to SQLAlchemy URLs, and masking for logs.

Pure Python (no SQLAlchemy), so configuration code can use it cheaply.
"""

from __future__ import annotations

import re
from urllib.parse import quote

from pyharvest.core.config.settings import mask_data_source

__all__ = ["LIBPQ_DIALECT", "is_libpq_dsn", "libpq_to_url", "mask_url"]

#: The dialect a libpq ``key=value`` data source names, as in goharvest (whose only database it is).
LIBPQ_DIALECT = "postgresql"

# libpq keywords that map onto the URL itself; every other keyword becomes a query parameter.
_URL_PARTS = ("host", "hostaddr", "port", "user", "password", "dbname")
# A value starts right after '=': goharvest's default ``password= dbname=…`` means an empty
# password, not the password "dbname=…".
_DSN_PAIR = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*=")
_URL_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def is_libpq_dsn(data_source: str) -> bool:
    """True for ``key=value …`` strings (goharvest's ``dataSource`` form), false for URLs."""
    s = data_source.strip()
    return bool(s) and not _URL_SCHEME.match(s) and _DSN_PAIR.match(s) is not None


def _parse_libpq(dsn: str) -> dict[str, str]:
    """Parse libpq's connection-string syntax: values may be empty, single-quoted, with
    backslash escapes (``password='a b\\'c'``)."""
    out: dict[str, str] = {}
    i, n = 0, len(dsn)
    while i < n:
        if dsn[i].isspace():
            i += 1
            continue
        m = _DSN_PAIR.match(dsn, i)
        if m is None:
            raise ValueError(f"malformed key=value data source near position {i}: expected key=value")
        key, i = m.group(1).lower(), m.end()
        value: list[str] = []
        if i < n and dsn[i] == "'":
            i += 1
            while i < n and dsn[i] != "'":
                if dsn[i] == "\\" and i + 1 < n:
                    i += 1
                value.append(dsn[i])
                i += 1
            if i >= n:
                raise ValueError(f"unterminated quoted value for {key!r} in data source")
            i += 1
        else:
            while i < n and not dsn[i].isspace():
                if dsn[i] == "\\" and i + 1 < n:
                    i += 1
                value.append(dsn[i])
                i += 1
        out[key] = "".join(value)
    return out


def libpq_to_url(dsn: str, driver: str = "postgresql+psycopg") -> str:
    """``host=h port=5432 user=u password= dbname=d sslmode=disable`` →
    ``postgresql+psycopg://u@h:5432/d?sslmode=disable``. Empty values (goharvest's
    ``password=``) are dropped, as libpq ignores them."""
    params = {k: v for k, v in _parse_libpq(dsn).items() if v != ""}
    user = params.get("user")
    password = params.get("password")
    host = params.get("host") or params.get("hostaddr") or ""
    port = params.get("port")
    netloc = ""
    if user is not None:
        netloc = quote(user, safe="")
        if password is not None:
            netloc += ":" + quote(password, safe="")
        netloc += "@"
    if "," in host or "/" in host:
        # Several hosts or a Unix-socket directory: libpq takes these as query parameters.
        query_host: str | None = host
        host = ""
    else:
        query_host = None
    netloc += f"[{host}]" if ":" in host else host
    if port and query_host is None:
        netloc += f":{port}"
    query = [(k, v) for k, v in params.items() if k not in _URL_PARTS]
    if query_host is not None:
        query.append(("host", query_host))
        if port:
            query.append(("port", port))
    url = f"{driver}://{netloc}/{quote(params.get('dbname', ''), safe='')}"
    if query:
        url += "?" + "&".join(f"{quote(k, safe='')}={quote(v, safe='')}" for k, v in query)
    return url


def mask_url(data_source: str) -> str:
    """The data source with any password replaced by ``***``; safe for logs and errors."""
    # One implementation for the whole project: the config's repr masks the same way.
    return mask_data_source(data_source)
