"""Martinet's tests, one package: the folders mirror the code's packages (docs/development.md, "Tests");
the helpers are ``tests.harness``."""
