"""The one place pyharvest's version is written: the build reads it (pyproject.toml), and
``pyharvest.__version__`` and ``reaper --version`` print it."""

__version__ = "0.1.0"
