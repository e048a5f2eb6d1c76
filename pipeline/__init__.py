"""``martinet.pipeline``: the PySpark side of the metrics export — a client-side tool, like
:mod:`martinet.messaging.client`, not part of a router.

:mod:`.source` is the live Spark source ``martinet`` (the metrics topic through a durable
subscription), :mod:`.jobs` the streaming queries (:mod:`.series` their forward fill per key),
:mod:`.report` the HTML report and ``__main__`` the ``martinet-pipeline`` command. Needs the ``spark`` extra
(``pip install 'martinet[spark]'``) and Java 17 or newer.
"""
