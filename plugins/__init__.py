"""Dialect plugins: how pyharvest talks to one kind of SQL database.

A dialect is a plain module of :data:`hookimpl`-decorated functions (see
:mod:`pyharvest.plugins.hookspecs`), registered under the ``pyharvest.dialects`` entry-point
group. The built-in dialects are registered exactly like third-party ones.
"""

from pyharvest.plugins.hookspecs import PROJECT_NAME, hookimpl, hookspec

__all__ = ["PROJECT_NAME", "hookimpl", "hookspec"]
