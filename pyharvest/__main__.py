"""``python -m pyharvest …``: the same as the ``reaper`` command."""

from pyharvest._cli import main

if __name__ == "__main__":
    raise SystemExit(main())
