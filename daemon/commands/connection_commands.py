"""Connection commands: PING, ECHO, HELLO, AUTH, SELECT, QUIT, RESET, CLIENT.

Replies and error texts are redis-server 7.0's (CLIENT SETINFO and NO-TOUCH
are 7.2's); the differential tests compare them byte for byte.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pfxcache.protocol.redis_strings import string2ll
from pfxcache.protocol.replies import OK, PONG, Error, SimpleString, Verbatim, quoted

from pfxcache.daemon.commands.calls import log_denial
from . import handles
from .context import MUTE_OFF, NO_REPLY, PAUSE_ALL, PAUSE_WRITE, Context

if TYPE_CHECKING:  # a type only: handlers see the server layer through their Context
    from pfxcache.daemon.server.clients import Client

SYNTAX_ERROR = Error("ERR syntax error")
NOT_AN_INTEGER = Error("ERR value is not an integer or out of range")
WRONGPASS = Error("WRONGPASS invalid username-password pair or user is disabled.")
NAME_ERROR = Error("ERR Client names cannot contain spaces, newlines or special characters.")

INT_MIN, INT_MAX = -(2**31), 2**31 - 1
LLONG_MIN, LLONG_MAX = -(2**63), 2**63 - 1


def parse_integer(raw: bytes, low: int = LLONG_MIN, high: int = LLONG_MAX) -> int | None:
    """Redis's string2ll: an exact decimal integer in [low, high], else None."""
    value = string2ll(raw)
    return value if value is not None and low <= value <= high else None


def arity_error(fullname: str) -> Error:
    return Error(f"ERR wrong number of arguments for '{fullname}' command")


def _valid_name(raw: bytes) -> bool:
    # Redis allows printable ASCII without spaces: '!' (33) to '~' (126).
    return all(33 <= byte <= 126 for byte in raw)


def authenticate(ctx: Context, username: bytes, password: bytes, command: str = "AUTH") -> bool:
    """Check a user/password pair and mark the client authenticated on success (a failure is
    an ACL LOG entry naming ``command``, as redis-server names it)."""
    name = username.decode("utf-8", "surrogateescape")
    if not ctx.server.acl.authenticate(name, password):
        log_denial(ctx, "auth", command, name)
        return False
    ctx.client.authenticated = True
    ctx.client.user = name
    return True


@handles("ping")
def ping(ctx: Context, argv: list[bytes]) -> Any:
    if len(argv) > 2:
        return arity_error("ping")
    client = ctx.client
    if client.pubsub is not None and client.resp == 2 and client.subscribed:  # Redis answers a subscriber with a pong array
        return [b"pong", argv[1] if len(argv) == 2 else b""]
    return PONG if len(argv) == 1 else argv[1]


@handles("echo")
def echo(ctx: Context, argv: list[bytes]) -> Any:
    return argv[1]


@handles("hello")
def hello(ctx: Context, argv: list[bytes]) -> Any:
    client = ctx.client
    version = 0
    position = 1
    if len(argv) >= 2:
        version = parse_integer(argv[1])
        position = 2
        if version is None:
            return Error("ERR Protocol version is not an integer or out of range")
        if version not in (2, 3):
            return Error("NOPROTO unsupported protocol version")
    while position < len(argv):
        option = argv[position].lower()
        remaining = len(argv) - 1 - position
        if option == b"auth" and remaining >= 2:
            if not authenticate(ctx, argv[position + 1], argv[position + 2], "HELLO"):
                return WRONGPASS
            position += 3
        elif option == b"setname" and remaining >= 1:
            if not _valid_name(argv[position + 1]):
                return NAME_ERROR
            client.name = argv[position + 1].decode()
            position += 2
        else:
            return Error(f"ERR Syntax error in HELLO option '{quoted(argv[position])}'")
    if not client.authenticated and ctx.server.auth_required:
        return Error(
            "NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO AUTH "
            "<user> <pass> option can be used to authenticate the client and select the RESP protocol "
            "version at the same time"
        )
    if version:
        client.resp = version
    return {
        "server": "redis",
        "version": ctx.server.redis_version,
        "proto": client.resp,
        "id": client.id,
        "mode": "standalone",
        "role": "master",
        "modules": [],
    }


@handles("auth")
def auth(ctx: Context, argv: list[bytes]) -> Any:
    if len(argv) > 3:
        return SYNTAX_ERROR
    if len(argv) == 2:
        if not ctx.server.auth_required:
            return Error(
                "ERR AUTH <password> called without any password configured for the default user. "
                "Are you sure your configuration is correct?"
            )
        username, password = b"default", argv[1]
    else:
        username, password = argv[1], argv[2]
    return OK if authenticate(ctx, username, password) else WRONGPASS


@handles("select")
def select(ctx: Context, argv: list[bytes]) -> Any:
    index = parse_integer(argv[1])
    if index is None:
        return NOT_AN_INTEGER
    if not INT_MIN <= index <= INT_MAX:
        return Error(f"ERR value is out of range, value must between {INT_MIN} and {INT_MAX}")
    if index != 0:
        return Error("ERR DB index is out of range")
    ctx.client.db = 0
    return OK


@handles("quit")
def quit_(ctx: Context, argv: list[bytes]) -> Any:
    ctx.client.close_after_reply = True
    return OK


@handles("reset")
def reset(ctx: Context, argv: list[bytes]) -> Any:
    client = ctx.client
    ctx.server.pubsub.drop_client(client)  # RESET leaves the subscribed state
    client.resp = 2
    client.db = 0
    client.multi = None
    ctx.server.watches.unwatch(client.id)
    ctx.server.observers.monitors.remove(client.id)
    client.monitoring = False
    client.mute = 0
    client.name = ""
    client.user = "default"
    client.authenticated = not ctx.server.auth_required
    return SimpleString("RESET")


# -- CLIENT -----------------------------------------------------------------------

# Redis 7.0.15's CLIENT HELP, with the lines of the subcommands this daemon has.
CLIENT_HELP = [
    "CLIENT <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "GETNAME",
    "    Return the name of the current connection.",
    "ID",
    "    Return the ID of the current connection.",
    "INFO",
    "    Return information about the current client connection.",
    "KILL <ip:port>",
    "    Kill connection made from <ip:port>.",
    "KILL <option> <value> [<option> <value> [...]]",
    "    Kill connections. Options are:",
    "    * ADDR (<ip:port>|<unixsocket>:0)",
    "      Kill connections made from the specified address",
    "    * LADDR (<ip:port>|<unixsocket>:0)",
    "      Kill connections made to specified local address",
    "    * TYPE (NORMAL|MASTER|REPLICA|PUBSUB)",
    "      Kill connections by type.",
    "    * USER <username>",
    "      Kill connections authenticated by <username>.",
    "    * SKIPME (YES|NO)",
    "      Skip killing current connection (default: yes).",
    "LIST [options ...]",
    "    Return information about client connections. Options:",
    "    * TYPE (NORMAL|MASTER|REPLICA|PUBSUB)",
    "      Return clients of specified type.",
    "UNPAUSE",
    "    Stop the current client pause, resuming traffic.",
    "PAUSE <timeout> [WRITE|ALL]",
    "    Suspend all, or just write, clients for <timeout> milliseconds.",
    "REPLY (ON|OFF|SKIP)",
    "    Control the replies sent to the current connection.",
    "SETNAME <name>",
    "    Assign the name <name> to the current connection.",
    "NO-EVICT (ON|OFF)",
    "    Protect current client connection from eviction.",
    "HELP",
    "    Prints this help.",
]


@handles("client|help")
def client_help(ctx: Context, argv: list[bytes]) -> Any:
    return [SimpleString(line) for line in CLIENT_HELP]


@handles("client|id")
def client_id(ctx: Context, argv: list[bytes]) -> Any:
    return ctx.client.id


@handles("client|getname")
def client_getname(ctx: Context, argv: list[bytes]) -> Any:
    return ctx.client.name or None


@handles("client|setname")
def client_setname(ctx: Context, argv: list[bytes]) -> Any:
    if not _valid_name(argv[2]):
        return NAME_ERROR
    ctx.client.name = argv[2].decode()
    return OK


def _client_type_matches(kind: bytes) -> Any:
    """A predicate on clients for a CLIENT LIST/KILL TYPE (subscribers are pubsub, the others
    normal; there are no masters or replicas); None for an unknown type name."""
    kind = kind.lower()
    if kind == b"normal":
        return lambda client: not client.subscribed
    if kind == b"pubsub":
        return lambda client: client.subscribed
    if kind in (b"master", b"replica", b"slave"):
        return lambda client: False
    return None


@handles("client|list")
def client_list(ctx: Context, argv: list[bytes]) -> Any:
    clients = list(ctx.server.clients)
    position = 2
    while position < len(argv):
        option = argv[position].lower()
        if option == b"type" and position + 1 < len(argv):
            matches = _client_type_matches(argv[position + 1])
            if matches is None:
                return Error(f"ERR Unknown client type '{quoted(argv[position + 1])}'")
            clients = [client for client in clients if matches(client)]
            position += 2
        elif option == b"id" and position + 1 < len(argv):
            wanted = set()
            for raw in argv[position + 1 :]:
                client_id = parse_integer(raw)
                if client_id is None or client_id <= 0:
                    return Error("ERR Invalid client ID")
                wanted.add(client_id)
            clients = [client for client in clients if client.id in wanted]
            position = len(argv)
        else:
            return SYNTAX_ERROR
    return Verbatim("".join(client.describe() + "\n" for client in clients))


@handles("client|info")
def client_info(ctx: Context, argv: list[bytes]) -> Any:
    return Verbatim(ctx.client.describe() + "\n")


@handles("client|kill")
def client_kill(ctx: Context, argv: list[bytes]) -> Any:
    me = ctx.client
    if len(argv) == 3:
        # Old form: CLIENT KILL addr:port -> OK or an error.
        address = argv[2].decode("utf-8", "replace")
        for client in ctx.server.clients:
            if client.addr == address:
                _kill(ctx, client)
                return OK
        return Error("ERR No such client")
    if len(argv) % 2:
        return SYNTAX_ERROR
    filters: list = []
    skip_me = True
    for position in range(2, len(argv), 2):
        option, raw = argv[position].lower(), argv[position + 1]
        value = quoted(raw)
        if option == b"id":
            client_id = parse_integer(raw)
            if client_id is None or client_id <= 0:
                return Error("ERR client-id should be greater than 0")
            filters.append(lambda client, wanted=client_id: client.id == wanted)
        elif option == b"type":
            matches = _client_type_matches(raw)
            if matches is None:
                return Error(f"ERR Unknown client type '{value}'")
            filters.append(matches)
        elif option == b"addr":
            filters.append(lambda client, wanted=value: client.addr == wanted)
        elif option == b"laddr":
            filters.append(lambda client, wanted=value: client.laddr == wanted)
        elif option == b"user":
            filters.append(lambda client, wanted=value: client.user == wanted)
        elif option == b"skipme":
            if raw.lower() == b"yes":
                skip_me = True
            elif raw.lower() == b"no":
                skip_me = False
            else:
                return SYNTAX_ERROR
        else:
            return SYNTAX_ERROR
    killed = 0
    for client in ctx.server.clients:
        if client is me and skip_me:
            continue
        if all(check(client) for check in filters):
            _kill(ctx, client)
            killed += 1
    return killed


def _kill(ctx: Context, client: Client) -> None:
    # Killing yourself closes after this reply, as Redis does.
    if client is ctx.client:
        client.close_after_reply = True
    else:
        client.kill()


@handles("client|no-evict")
def client_flag_on_off(ctx: Context, argv: list[bytes]) -> Any:
    if argv[2].lower() in (b"on", b"off"):
        return OK
    return SYNTAX_ERROR


# -- CLIENT PAUSE / UNPAUSE / REPLY ------------------------------------------------------


@handles("client|pause")
def client_pause(ctx: Context, argv: list[bytes]) -> Any:
    if len(argv) > 4:
        return Error("ERR unknown subcommand or wrong number of arguments for 'PAUSE'. Try CLIENT HELP.")
    timeout = parse_integer(argv[2])
    if timeout is None:
        return Error("ERR timeout is not an integer or out of range")
    if timeout < 0:
        return Error("ERR timeout is negative")
    kind = PAUSE_ALL
    if len(argv) == 4:
        mode = argv[3].lower()
        if mode == b"write":
            kind = PAUSE_WRITE
        elif mode != b"all":
            return Error("ERR CLIENT PAUSE mode must be WRITE or ALL")
    ctx.server.gate.pause(kind, timeout)
    return OK


@handles("client|unpause")
def client_unpause(ctx: Context, argv: list[bytes]) -> Any:
    ctx.server.gate.unpause()
    return OK


@handles("client|reply")
def client_reply(ctx: Context, argv: list[bytes]) -> Any:
    """ON answers +OK; OFF and SKIP answer nothing (SKIP also mutes the next command's reply)."""
    client = ctx.client
    mode = argv[2].lower()
    if mode == b"on":
        client.mute = 0
        return OK
    if mode == b"off":
        client.mute = MUTE_OFF
        return NO_REPLY
    if mode == b"skip":
        if client.mute != MUTE_OFF:
            client.mute = 2  # this command's (empty) reply and the next one's
        return NO_REPLY
    return SYNTAX_ERROR
