"""Runs one documentation page's Python blocks in order, in one namespace, as a reader pasting
them into one interpreter would (top-level ``await`` allowed, as in ``python -m asyncio``).

Run by ``tests/test_doc_snippets.py`` as ``python -u -m tests.helpers.doc_snippets_driver blocks.json``; the
JSON lists ``{"path", "line", "code", "mode"}`` per block, mode ``run``, ``setup`` or
``until-stopped``. Progress goes to stdout as ``@@snippet <n> start|ok|stopped|returned`` lines; a block
that fails ends the run with its traceback, whose line numbers are the page's own.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import json
import sys
import traceback
import types
from typing import Any


def run_block(code: str, path: str, line: int, namespace: dict[str, Any]) -> None:
    # Padding puts the block at its own line of the page, so tracebacks point into the page.
    source = "\n" * (line - 1) + code
    compiled = compile(source, path, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    result = eval(compiled, namespace)  # noqa: S307 - the documentation's own code
    if inspect.iscoroutine(result):
        asyncio.run(result)


def main() -> int:
    with open(sys.argv[1], encoding="utf-8") as f:
        blocks = json.load(f)
    # The blocks' module is __main__, as a script's is (SQLAlchemy resolves annotations through it).
    module = types.ModuleType("__main__")
    sys.modules["__main__"] = module
    namespace: dict[str, Any] = module.__dict__
    for n, block in enumerate(blocks):
        print(f"@@snippet {n} start", flush=True)
        try:
            run_block(block["code"], block["path"], block["line"], namespace)
        except KeyboardInterrupt:
            if block["mode"] != "until-stopped":
                raise
            print(f"@@snippet {n} stopped", flush=True)
            continue
        except BaseException:
            traceback.print_exc()
            print(f"@@snippet {n} failed", flush=True)
            return 1
        if block["mode"] == "until-stopped":
            # A block that handles SIGINT itself (Harvest.run()) returns: the test tells
            # whether that came after its signal or before.
            print(f"@@snippet {n} returned", flush=True)
            continue
        print(f"@@snippet {n} ok", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
