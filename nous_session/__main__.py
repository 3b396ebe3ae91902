"""``python -m nous_session``: the command line (see :mod:`nous_session.cli`)."""

import sys

from nous_session.cli import main

if __name__ == "__main__":
    sys.exit(main())
