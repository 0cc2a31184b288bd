"""The I/O layer: listeners, one task per connection, client state, out-of-band frames."""
