"""``sys$xa`` configuration: nothing to set yet (the element may stay out of the file)."""

from __future__ import annotations

import attrs

from martinet.kernel import config_class


@config_class
@attrs.frozen(kw_only=True)
class XAConfig:
    """``sys$xa`` has no attributes: it reports, lists and resolves what the queue manager
    keeps; its pools element is the only thing a config may give it."""
