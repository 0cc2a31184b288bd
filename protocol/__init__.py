"""Sans-IO RESP: bytes in, commands out; replies in, bytes out."""
