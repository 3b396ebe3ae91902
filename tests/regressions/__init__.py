"""Regressions: each test failed on the code before its fix."""
