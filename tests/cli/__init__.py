"""The command line, run as a separate process."""
