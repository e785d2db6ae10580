"""Optional ``reaper`` sub-commands.

Each module here exposes ``register(subparsers)``, which adds its sub-command to the
``reaper`` parser and binds it to a function ``(argparse.Namespace) -> int`` (the exit
code); :mod:`pyharvest._cli` lists the ``register`` functions it wires in.
"""
