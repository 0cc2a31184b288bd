"""``python -m pfxcache.daemon.config > conf/pfxcached.conf``: the documented config file, from the table."""

import sys

from pfxcache.daemon.config.conf_file import conf_text

sys.stdout.write(conf_text())
