"""The tests' helpers, one package: imported as ``tests.harness.<module>`` by test modules,
by ``tests/conftest.py`` (which only declares the fixtures) and by the scripts in ``bench/``
(which put the repository's top folder on ``sys.path``).

- :mod:`~tests.harness.paths`: the repository's folders the tests read (examples, conf, bench);
- :mod:`~tests.harness.polling`: :func:`~tests.harness.polling.wait_until`, the one way to
  wait for what the code under test reaches in the background, and bus draining;
- :mod:`~tests.harness.routers`: single routers in this process (a store and queues; AMQP);
- :mod:`~tests.harness.network`: several routers in this process, built from RouterConfig
  objects (:func:`~tests.harness.network.router_config`);
- :mod:`~tests.harness.processes`: real ``martinet run`` processes;
- :mod:`~tests.harness.netharness`: networks of such processes under faults, counted traffic;
- :mod:`~tests.harness.faultproxy`: the fault proxy put on links;
- :mod:`~tests.harness.sparkcluster`: Spark as separate processes for the pipeline's tests;
- :mod:`~tests.harness.wallclock`, :mod:`~tests.harness.routesim`,
  :mod:`~tests.harness.probe_plugin`, :mod:`~tests.harness.selector_vectors`: a mocked wall
  clock, a route exchange simulator, probe swiftlets, the selector conformance table;
- ``crash_writer.py`` and ``sparkfaults/sitecustomize.py`` run in child processes.
"""
