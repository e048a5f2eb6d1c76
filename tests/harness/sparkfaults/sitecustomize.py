"""Deterministic kill points in the live source, for the pipeline's tests.

Spark runs the live source's reader in Python processes of its own (the streaming source
runner next to the driver, executor workers for the reads of a batch's partitions), which a
test cannot reach. A test that puts this folder on ``PYTHONPATH`` has every Python process of
the pipeline import this module at start-up (``sitecustomize``), and with
``MARTINET_KILL_AT=<method>:<when>:<n>`` set, the ``n``-th call in one process of the rows
reader's ``latestOffset``, ``commit`` or ``read`` (``before`` it runs, or ``after`` it
returned) writes the point to the file ``MARTINET_KILL_MARK`` and kills the whole pipeline
with SIGKILL: the driver, its JVM and every Python worker, as a crash at exactly that moment
would. With ``<when>`` ``hold``, the first ``n`` calls (in any processes: the mark files are
created exclusively) each write ``<point> <pid>`` to the file ``MARTINET_KILL_MARK-<k>`` (k
from 1 to ``n``, in the order they came) and wait there (up to 10 minutes) for the test to kill
what it chooses (an executor's Python worker or JVM); the later calls run as usual. The source
itself has no hook.

On a cluster an executor's Python workers are not the pipeline's children (a worker daemon
started them): the pipeline, which the test starts in a session of its own, writes its
process id next to the mark when it starts, and a kill point met in an executor (``read``)
kills the pipeline by that id, then its own Python processes.
"""

from __future__ import annotations

import os

_POINT = os.environ.get("MARTINET_KILL_AT", "")

if _POINT:
    import functools
    import signal
    import time
    from pathlib import Path

    from martinet.pipeline import source

    _METHOD, _WHEN, _NTH = _POINT.split(":")
    _calls = 0
    _MARK = Path(os.environ["MARTINET_KILL_MARK"])
    _PIPELINE = _MARK.with_name(_MARK.name + ".pipeline")  # the pipeline's process id
    if os.getpid() == os.getsid(0):  # the pipeline itself: the test made it a session leader
        _PIPELINE.write_text(str(os.getpid()))

    def _kill() -> None:
        _MARK.write_text(_POINT)
        # The driver, the JVM and the source's runner are the first group of the pipeline's
        # session; a worker of a local executor sits in the group of PySpark's daemon, in that
        # session too; on a cluster, in a daemon's group in the session of the cluster's
        # worker. This group is killed last (this process with it).
        pipeline = int(_PIPELINE.read_text()) if _PIPELINE.exists() else os.getsid(0)
        os.killpg(pipeline, signal.SIGKILL)
        os.killpg(os.getpgid(0), signal.SIGKILL)

    def _hold() -> None:
        for number in range(1, int(_NTH) + 1):
            try:
                mark = f"{os.environ['MARTINET_KILL_MARK']}-{number}"
                descriptor = os.open(mark, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
            except FileExistsError:
                continue  # another call holds (or held) there
            os.write(descriptor, f"{_POINT} {os.getpid()}".encode())
            os.close(descriptor)
            time.sleep(600)  # the test kills this process (or its parent) long before
        # held n times already: the calls run on

    def _sync(reader: source._Reader) -> None:
        """Wait until the router has the acknowledgements sent so far: they go as settled
        dispositions, unanswered; a coordinator's attach on the same connection is answered
        only after the router has read every frame before it."""
        session = reader._connection.session(transacted=True)
        session.close()

    def _wrap(name: str) -> None:
        original = getattr(source._Reader, name)

        @functools.wraps(original)
        def wrapper(self, *args, **kwargs):
            global _calls
            if self.table != "rows" or name != _METHOD:
                return original(self, *args, **kwargs)
            if _WHEN == "hold":
                _hold()
                return original(self, *args, **kwargs)
            _calls += 1
            if _calls == int(_NTH) and _WHEN == "before":
                _kill()
            result = original(self, *args, **kwargs)
            if _calls == int(_NTH) and _WHEN == "after":
                if name == "commit":
                    _sync(self)
                _kill()
            return result

        setattr(source._Reader, name, wrapper)

    for _name in ("latestOffset", "commit", "read"):
        _wrap(_name)
