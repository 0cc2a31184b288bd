"""The pfxcached daemon: a trio server around the store."""
