"""``sys$routing``: router-to-router links, route exchange, the routing table (work in progress)."""
