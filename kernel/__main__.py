"""``python -m kernel`` is the ``martinet`` command."""

from .cli import entry_point

entry_point()
