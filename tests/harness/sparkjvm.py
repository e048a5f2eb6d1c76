"""Spark's JVMs in the tests, started in half the time and two fifths of the CPU.

Each ``martinet-pipeline`` run the tests make starts a JVM (on a standalone cluster, one
executor JVM per worker as well), and most of such a run is that start: about 10 s and 20 s
of CPU on this 2-core machine, against a few hundred rows of work. The JVM settings:

- ``-XX:TieredStopAtLevel=1``: the JIT compiles with C1 only. A JVM that lives seconds
  never repays C2's compile time; measured, 20 → 12.5 s of CPU per empty pipeline run, and
  a cluster executor's 17 → 9 s. Every JVM of the tests takes it (``JAVA_TOOL_OPTIONS``:
  the cluster's daemons and the executors they start too, which no Spark setting reaches
  from a test). Each JVM says so in one line on its stderr ("Picked up …"). With it
  ``-XX:+UseSerialGC``: a heap of a few hundred MB collected by the running thread, without
  G1's concurrent threads; measured on one ``--once`` run over a known load's files, 32.7-34.5
  → 30.7-32.3 s of CPU (alternated).
- ``-XX:SharedArchiveFile``: a class-data archive (CDS) of the classes one pipeline run
  loaded, mapped instead of parsed and verified again: 12.5 → 8 s. The archive holds the
  class path it was made with, so only JVMs with that class path take it: the ones
  ``spark-submit`` launches (``SPARK_SUBMIT_OPTS``: the pipelines' drivers, ``local[2]``'s
  executors inside them, the Spark Connect server) and a cluster's executors
  (:func:`cluster_daemon_options`). Others, such as the short JVM of Spark's launch scripts
  that builds a command line, would print a warning on their standard output.

The archive is made once per test run, by the first worker that needs it, from an empty
``--once`` run; the others wait on a lock. The JVM checks the archive against its class
path and ignores (with a warning) one that does not match, so a wrong archive costs time,
never a result. The product runs its JVMs with Spark's defaults: a pipeline that runs for
hours gains from C2.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

SHORT_LIVED = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def quick_start_environment(folder: Path) -> dict[str, str]:
    """``JAVA_TOOL_OPTIONS`` and ``SPARK_SUBMIT_OPTS`` (added to what the environment holds),
    with the class-data archive in ``folder`` (made there first if it is missing)."""
    archive = folder / "spark-classes.jsa"
    with (folder / "spark-jvm.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not archive.exists():
            _make_archive(archive)
    options = {"JAVA_TOOL_OPTIONS": SHORT_LIVED}
    if archive.exists():
        options["SPARK_SUBMIT_OPTS"] = f"-XX:SharedArchiveFile={archive}"
    return {name: " ".join(filter(None, [os.environ.get(name), value])) for name, value in options.items()}


def cluster_daemon_options() -> dict[str, str]:
    """``JAVA_TOOL_OPTIONS`` for a standalone cluster's master and workers, which pass their
    environment on to the executors they start: the options of every JVM, with the
    class-data archive that :func:`quick_start_environment` gave ``spark-submit``'s JVMs
    (an executor's class path is a driver's; test_cluster.py took 299 → 272 s of CPU). The daemons' own
    launch scripts then warn, in their logs, that the archive does not fit them."""
    archive = [o for o in os.environ.get("SPARK_SUBMIT_OPTS", "").split() if o.startswith("-XX:SharedArchiveFile=")]
    return {"JAVA_TOOL_OPTIONS": " ".join(filter(None, [os.environ.get("JAVA_TOOL_OPTIONS"), *archive]))}


def _make_archive(archive: Path) -> None:
    """One empty ``--once`` pipeline run whose JVM writes the classes it loaded to ``archive``
    as it exits (into a partial file first: a JVM killed mid-write leaves no archive)."""
    work = archive.with_suffix(".run")
    (work / "input").mkdir(parents=True, exist_ok=True)
    partial = archive.with_suffix(".partial")
    env = os.environ | {
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_SUBMIT_OPTS": f"{SHORT_LIVED} -XX:ArchiveClassesAtExit={partial}",
    }
    command = [sys.executable, "-m", "martinet.pipeline", "--master", "local[2]", "--source", "files"]
    command += ["--input", str(work / "input"), "--format", "jsonl", "--output", str(work / "output"), "--once"]
    subprocess.run(command, env=env, capture_output=True, timeout=300, check=False)
    if partial.exists():
        partial.rename(archive)
