"""``python -m pfxcache.daemon``: the same as the ``pfxcached`` console script."""

import sys

from .cli import main

sys.exit(main())
