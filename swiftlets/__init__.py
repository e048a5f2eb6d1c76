"""Martinet's built-in swiftlets, one folder each; every one registers through the
``martinet.swiftlets`` entry-point group, as third-party swiftlets do.

A swiftlet's ``__init__`` imports its implementation inside its hooks, not at the top:
importing a submodule runs the package's ``__init__`` first, and programs that read only a
swiftlet's ``api`` (the client, the admin tool, the Spark pipeline's Python workers, started
by the dozen per pipeline run) would otherwise load the whole router, 0.3 s of CPU each.
"""
