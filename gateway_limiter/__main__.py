"""``python -m gateway_limiter``: the ``gateway-limiter`` command line."""

import sys

from gateway_limiter.cli import main

if __name__ == "__main__":
    sys.exit(main())
