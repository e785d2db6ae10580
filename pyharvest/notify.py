"""Where the stasher's push wake-ups lived before the stasher became a package: the name now
stands for :mod:`pyharvest.stasher.notify` itself (settings changed through it reach the
stasher), so that older imports (``from pyharvest import notify``) keep working."""

import sys

from pyharvest.stasher import notify

sys.modules[__name__] = notify
