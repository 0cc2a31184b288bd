"""What operators see: INFO, Prometheus metrics, SLOWLOG, LATENCY, MONITOR, logs and memory figures."""
