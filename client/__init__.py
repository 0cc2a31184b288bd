"""Client library for inference workers (built on redis-py)."""
