"""``python -m martinet.swiftlets.store PATH SYNC`` runs a store process (see :mod:`.dbprocess`)."""

import sys

from .dbprocess import main

sys.exit(main(sys.argv[1:]))
