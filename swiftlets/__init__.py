"""Martinet's built-in swiftlets, one folder each; every one registers through the
``martinet.swiftlets`` entry-point group, as third-party swiftlets do."""
