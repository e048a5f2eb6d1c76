"""Martinet's tests, one package: the folders mirror the code's packages (README, "Tests");
the helpers are ``tests.harness``."""
