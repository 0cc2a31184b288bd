"""The one error that stops the daemon before it serves: :class:`StartupError`."""


class StartupError(Exception):
    """The daemon cannot start (port in use, bad unix socket path, an arena the host cannot back ...).

    Its message is the log line: ``pfxcached`` logs it at warning level, as redis-server logs
    its startup failures, and exits with status 1.
    """
