"""The I/O layer: listeners, one task per connection, client state, out-of-band frames; and the
assembly (assembly.py) that builds the daemon's services in order and closes them in reverse."""
