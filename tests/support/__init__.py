"""Helpers the tests share, and the scripts they run as child processes."""
