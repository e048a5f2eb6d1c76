"""``python -m swiftlets.store PATH SYNC`` runs a store engine (see :mod:`.engine`)."""

import sys

from .engine import main

sys.exit(main(sys.argv[1:]))
