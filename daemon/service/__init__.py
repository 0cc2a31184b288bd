"""The services between the command table and the store: PrefixService, shard locks, KV events, pub/sub."""
