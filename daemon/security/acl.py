"""Redis-style ACL users: passwords, allowed commands and key patterns.

Plain synchronous code. The model follows Redis 7.0's ``acl.c`` for the
parts pfxcache implements: one root selector per user (no ``(...)``
selectors), key patterns that grant read and write (``~pattern``; no
``%R~``/``%W~``), and channel rules kept only so ``ACL LIST`` reads as
redis-server's. Passwords are kept as SHA-256 hex digests, as Redis keeps them.

:class:`AclUsers` holds the users of one server. Its ``restricted`` attribute
is False while the only user is an all-permissive ``default``: dispatch then
skips every ACL check with that one attribute test.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable
from typing import Any

from pfxcache.protocol.redis_strings import splitargs, stringmatchlen

__all__ = ["AclError", "AclUsers", "User", "hash_password", "valid_username"]

ERR_UNKNOWN = "Unknown command or category name in ACL"
ERR_SYNTAX = "Syntax error"
ERR_NO_PASSWORD = "The password you are trying to remove from the user does not exist"
ERR_BAD_HASH = (
    "The password hash must be exactly 64 characters and contain only lowercase hexadecimal characters"
)
ERR_KEY_AFTER_ALL = (
    "Adding a pattern after the * pattern (or the 'allkeys' flag) is not valid and does not have any "
    "effect. Try 'resetkeys' to start with an empty list of patterns"
)
ERR_CHANNEL_AFTER_ALL = (
    "Adding a pattern after the * pattern (or the 'allchannels' flag) is not valid and does not have any "
    "effect. Try 'resetchannels' to start with an empty list of channels"
)

NOPERM_KEY = "NOPERM this user has no permissions to access one of the keys used as arguments"
NOPERM_CHANNEL = "NOPERM this user has no permissions to access one of the channels used as arguments"

#: Commands whose arguments name channels, as Redis 7.0's ACL checks them: the first
#: channel argument, the last (None: to the end), and whether they are patterns.
CHANNEL_ARGS = {
    "publish": (1, 2, False),
    "subscribe": (1, None, False),
    "psubscribe": (1, None, True),
    "spublish": (1, 2, False),
    "ssubscribe": (1, None, False),
}


class AclError(Exception):
    """A rule that could not be applied: ``op`` is the rule, ``reason`` Redis's text."""

    def __init__(self, op: str, reason: str) -> None:
        super().__init__(f"Error in ACL SETUSER modifier '{op}': {reason}")
        self.op = op
        self.reason = reason


def hash_password(password: bytes) -> str:
    return hashlib.sha256(password).hexdigest()


def _is_hash(text: str) -> bool:
    return len(text) == 64 and all(c in "0123456789abcdef" for c in text)


class User:
    """One ACL user (Redis's ``user`` with its root selector)."""

    __slots__ = (
        "name", "enabled", "nopass", "passwords", "sanitize_payload", "all_commands",
        "allowed", "rules", "all_keys", "key_patterns", "all_channels", "channel_patterns",
    )

    def __init__(self, name: str) -> None:
        self.name = name
        self.enabled = False
        self.nopass = False
        self.passwords: list[str] = []  # SHA-256 hex digests, in the order added
        self.sanitize_payload = False
        #: The "future commands" bit: set by +@all/allcommands, cleared by -@all/nocommands.
        self.all_commands = False
        #: Full names ("pfxget", "config|get") this user may run.
        self.allowed: set[str] = set()
        #: Command rules after the +@all/-@all base, as typed (lowercased): "+@pfx", "-config".
        self.rules: list[str] = []
        self.all_keys = False
        self.key_patterns: list[bytes] = []
        self.all_channels = False
        self.channel_patterns: list[str] = []

    def copy(self) -> User:
        other = User(self.name)
        for slot in self.__slots__:
            value = getattr(self, slot)
            setattr(other, slot, value.copy() if isinstance(value, (list, set)) else value)
        return other

    # -- checks --------------------------------------------------------------------

    def check_password(self, password: bytes) -> bool:
        if self.nopass:
            return True
        digest = hash_password(password)
        return any(hmac.compare_digest(digest, stored) for stored in self.passwords)

    def channel_allowed(self, channel: bytes, is_pattern: bool) -> bool:
        """Redis 7's ACLCheckChannelAgainstList: a pattern argument must equal an allowed pattern."""
        if self.all_channels:
            return True
        for allowed in self.channel_patterns:
            pattern = allowed.encode("utf-8", "surrogateescape")
            if (pattern == channel) if is_pattern else stringmatchlen(pattern, channel):
                return True
        return False

    def key_allowed(self, key: bytes) -> bool:
        if self.all_keys:
            return True
        return any(stringmatchlen(pattern, key) for pattern in self.key_patterns)

    # -- description (ACL LIST / GETUSER) ------------------------------------------

    def flag_names(self) -> list[str]:
        flags = ["on" if self.enabled else "off"]
        if self.nopass:
            flags.append("nopass")
        if self.sanitize_payload:
            flags.append("sanitize-payload")
        return flags

    def keys_text(self) -> str:
        if self.all_keys:
            return "~*"
        return " ".join("~" + p.decode("utf-8", "surrogateescape") for p in self.key_patterns)

    def channels_text(self) -> str:
        if self.all_channels:
            return "&*"
        if not self.channel_patterns:
            return "resetchannels"
        return " ".join("&" + p for p in self.channel_patterns)


class AclUsers:
    """The users of one server, by name, and the rules that change them.

    ``commands`` is the server's command table, used through what it offers
    (``walk``, ``get``, ``categories``, and each row's ``keys(argv)``), so this
    module stays below the command layer and imports nothing from it.
    """

    def __init__(self, commands: Any) -> None:
        self.commands = commands
        self.users: dict[str, User] = {}
        self.restricted = False
        default = User("default")
        self._apply(default, ["reset", "on", "nopass", "allkeys", "allchannels", "+@all"])
        default.sanitize_payload = False
        self.users["default"] = default
        self._refresh()

    # -- lookups -------------------------------------------------------------------

    @property
    def default(self) -> User:
        return self.users["default"]

    def _all_fullnames(self) -> set[str]:
        return {spec.fullname for spec in self.commands.walk()}

    def _refresh(self) -> None:
        """Recompute ``restricted``: False only for a lone, all-permissive default user."""
        default = self.users.get("default")
        self.restricted = not (
            len(self.users) == 1
            and default is not None
            and default.all_keys
            and default.all_channels
            and default.allowed >= self._all_fullnames()
        )

    @property
    def default_open(self) -> bool:
        """True when new connections start authenticated (default user: on, nopass)."""
        default = self.default
        return default.enabled and default.nopass

    def authenticate(self, username: str, password: bytes) -> bool:
        user = self.users.get(username)
        return user is not None and user.enabled and user.check_password(password)

    # -- the check dispatch makes ----------------------------------------------------

    def check(self, username: str, spec: Any, argv: list[bytes]) -> str | None:
        """None when ``username`` may run ``argv``, else the NOPERM error text."""
        user = self.users.get(username)
        if user is None:
            return f"NOPERM this user has no permissions to run the '{spec.fullname}' command"
        if spec.fullname not in user.allowed and "no_auth" not in spec.flags:
            return f"NOPERM this user has no permissions to run the '{spec.fullname}' command"
        if not user.all_keys and spec.key_specs:
            keys = spec.keys(argv)
            if keys:
                for position, _flags in keys:
                    if not user.key_allowed(argv[position]):
                        return NOPERM_KEY
        channels = CHANNEL_ARGS.get(spec.fullname)
        if channels is not None and not user.all_channels:
            first, last, is_pattern = channels
            for channel in argv[first:last]:
                if not user.channel_allowed(channel, is_pattern):
                    return NOPERM_CHANNEL
        return None

    def denial(self, username: str, spec: Any, argv: list[bytes]) -> tuple[str, str]:
        """Why :meth:`check` refused ``argv``, as ACL LOG records it: ("command", the command's
        full name), ("key", the first key refused) or ("channel", the first channel refused)."""
        user = self.users.get(username)
        if user is not None and (spec.fullname in user.allowed or "no_auth" in spec.flags):
            for position, _flags in (spec.keys(argv) or ()) if not user.all_keys else ():
                if not user.key_allowed(argv[position]):
                    return "key", argv[position].decode("utf-8", "surrogateescape")
            channels = CHANNEL_ARGS.get(spec.fullname)
            if channels is not None and not user.all_channels:
                first, last, is_pattern = channels
                for channel in argv[first:last]:
                    if not user.channel_allowed(channel, is_pattern):
                        return "channel", channel.decode("utf-8", "surrogateescape")
        return "command", spec.fullname

    # -- changes ---------------------------------------------------------------------

    def setuser(self, name: str, rules: Iterable[str]) -> None:
        """ACL SETUSER: create ``name`` if needed and apply ``rules``, all or nothing."""
        existing = self.users.get(name)
        user = existing.copy() if existing is not None else self._new_user(name)
        self._apply(user, rules)
        self.users[name] = user
        self._refresh()

    def _new_user(self, name: str) -> User:
        user = User(name)
        # A new user: off, no passwords, no keys, no channels (acl-pubsub-default), -@all.
        return user

    def replace_users(self, users: dict[str, User]) -> None:
        """ACL LOAD: these users, and only these, from now on."""
        self.users = users
        self._refresh()

    def deluser(self, name: str) -> bool:
        removed = self.users.pop(name, None) is not None
        self._refresh()
        return removed

    def set_default_password(self, password: str) -> None:
        """What ``requirepass`` does to the default user: resetpass + >pass, or nopass."""
        if password:
            rules = ["resetpass", ">" + password]
        else:
            rules = ["nopass"]
        self.setuser("default", rules)

    def _apply(self, user: User, rules: Iterable[str]) -> None:
        for op in rules:
            self._apply_one(user, op)

    def _apply_one(self, user: User, op: str) -> None:
        lower = op.lower()
        if lower == "on":
            user.enabled = True
        elif lower == "off":
            user.enabled = False
        elif lower == "nopass":
            user.nopass = True
            user.passwords.clear()
        elif lower == "resetpass":
            user.nopass = False
            user.passwords.clear()
        elif lower == "sanitize-payload":
            user.sanitize_payload = True
        elif lower == "skip-sanitize-payload":
            user.sanitize_payload = False
        elif lower == "allkeys" or op == "~*":
            user.all_keys = True
            user.key_patterns.clear()
        elif lower == "resetkeys":
            user.all_keys = False
            user.key_patterns.clear()
        elif lower == "allchannels" or op == "&*":
            user.all_channels = True
            user.channel_patterns.clear()
        elif lower == "resetchannels":
            user.all_channels = False
            user.channel_patterns.clear()
        elif lower in ("allcommands", "+@all"):
            user.all_commands = True
            user.allowed = self._all_fullnames()
            user.rules.clear()
        elif lower in ("nocommands", "-@all"):
            user.all_commands = False
            user.allowed = set()
            user.rules.clear()
        elif lower == "reset":
            for step in ("resetpass", "resetkeys", "resetchannels", "off", "-@all"):
                self._apply_one(user, step)
            user.sanitize_payload = True
        elif op.startswith(">"):
            digest = hash_password(op[1:].encode("utf-8", "surrogateescape"))
            if digest not in user.passwords:
                user.passwords.append(digest)
            user.nopass = False
        elif op.startswith("#"):
            if not _is_hash(op[1:]):
                raise AclError(op, ERR_BAD_HASH)
            if op[1:] not in user.passwords:
                user.passwords.append(op[1:])
            user.nopass = False
        elif op.startswith("<") or op.startswith("!"):
            digest = hash_password(op[1:].encode("utf-8", "surrogateescape")) if op[0] == "<" else op[1:]
            if op[0] == "!" and not _is_hash(digest):
                raise AclError(op, ERR_BAD_HASH)
            if digest not in user.passwords:
                raise AclError(op, ERR_NO_PASSWORD)
            user.passwords.remove(digest)
        elif op.startswith("~"):
            if user.all_keys:
                raise AclError(op, ERR_KEY_AFTER_ALL)
            pattern = op[1:].encode("utf-8", "surrogateescape")
            if pattern not in user.key_patterns:
                user.key_patterns.append(pattern)
        elif op.startswith("&"):
            if user.all_channels:
                raise AclError(op, ERR_CHANNEL_AFTER_ALL)
            if op[1:] not in user.channel_patterns:
                user.channel_patterns.append(op[1:])
        elif op[:2] in ("+@", "-@"):
            category = lower[2:]
            if category not in self.commands.categories:
                raise AclError(op, ERR_UNKNOWN)
            names = {s.fullname for s in self.commands.walk() if "@" + category in s.acl_categories}
            self._set(user, names, op[0] == "+")
            self._add_rule(user, lower)
        elif op[:1] in ("+", "-"):
            spec = self.commands.get(lower[1:])
            if spec is None or "|" in lower and spec.container is None:
                raise AclError(op, ERR_UNKNOWN)
            self._set(user, {s.fullname for s in spec.walk()}, op[0] == "+")
            self._add_rule(user, lower)
        else:
            raise AclError(op, ERR_SYNTAX)

    @staticmethod
    def _set(user: User, names: set[str], allow: bool) -> None:
        if allow:
            user.allowed |= names
        else:
            user.allowed -= names

    @staticmethod
    def _add_rule(user: User, rule: str) -> None:
        # As ACLUpdateCommandRules(): a rule replaces an earlier one on the same
        # name (a command's rule replaces its subcommands' too).
        name = rule[1:]
        user.rules = [
            r for r in user.rules
            if r[1:] != name and not (not name.startswith("@") and r[1:].startswith(name + "|"))
        ]
        user.rules.append(rule)

    # -- description -------------------------------------------------------------------

    def command_rules(self, user: User) -> str:
        """The command rules as ACL LIST shows them: the base, then the rules that still matter."""
        allowed = self._all_fullnames() if user.all_commands else set()
        parts = ["+@all" if user.all_commands else "-@all"]
        for rule in user.rules:
            name = rule[1:]
            if name.startswith("@"):
                names = {s.fullname for s in self.commands.walk() if name in s.acl_categories}
            else:
                spec = self.commands.get(name)
                names = {s.fullname for s in spec.walk()} if spec is not None else set()
            after = allowed | names if rule[0] == "+" else allowed - names
            if after != allowed:
                parts.append(rule)
                allowed = after
        return " ".join(parts)

    def describe(self, user: User) -> str:
        """The ``user ...`` line of ACL LIST (Redis's ACLDescribeUser)."""
        parts = ["user", user.name, *user.flag_names()]
        parts += ["#" + digest for digest in user.passwords]
        keys = user.keys_text()
        if keys:
            parts.append(keys)
        parts.append(user.channels_text())
        parts.append(self.command_rules(user))
        return " ".join(parts)

    def getuser(self, user: User) -> dict:
        channels = user.channels_text()
        return {
            "flags": user.flag_names(),
            "passwords": list(user.passwords),
            "commands": self.command_rules(user),
            "keys": user.keys_text(),
            "channels": "" if channels == "resetchannels" else channels,
            "selectors": [],
        }

    # -- the ACL file ----------------------------------------------------------------------

    def load_users(self, lines: Iterable[list[str]], where: str = "the config file") -> None:
        """Apply ``user`` lines of the config file (name, then rules); all or nothing."""
        staged = AclUsers(self.commands)
        staged.users = {name: user.copy() for name, user in self.users.items()}
        for argv in lines:
            name = argv[0]
            if not valid_username(name):
                raise ValueError(f"{where}: Usernames can't contain spaces or null characters")
            try:
                staged.setuser(name, argv[1:])
            except AclError as exc:
                raise ValueError(f"{where}: user {name}: {exc.op}: {exc.reason}") from None
        self.users = staged.users
        self._refresh()

    def load_file(self, path: str) -> None:
        """Load Redis's ACL file format: ``user <name> <rule> ...`` per line.

        Blank lines and ``#`` comments are skipped. All or nothing: a bad line
        raises ValueError naming the file and line, and no user changes.
        """
        with open(path, "rb") as f:
            data = f.read()
        staged = AclUsers(self.commands)
        staged.users = {name: user.copy() for name, user in self.users.items()}
        for lineno, raw in enumerate(data.split(b"\n"), 1):
            line = raw.strip(b" \t\r\n")
            if not line or line.startswith(b"#"):
                continue
            argv = splitargs(line)
            where = f"{path}:{lineno}"
            if not argv or argv[0].lower() != b"user" or len(argv) < 2:
                raise ValueError(f"{where}: line should start with user keyword")
            name = argv[1].decode("utf-8", "surrogateescape")
            if not valid_username(name):
                raise ValueError(f"{where}: Usernames can't contain spaces or null characters")
            try:
                staged.setuser(name, [a.decode("utf-8", "surrogateescape") for a in argv[2:]])
            except AclError as exc:
                raise ValueError(f"{where}: {exc.op}: {exc.reason}") from None
        self.users = staged.users
        self._refresh()


def load_acl_file(commands: Any, path: str) -> dict[str, User]:
    """ACL LOAD: the users of ``path`` alone (a ``default`` user is made if the file has none).

    Raises ValueError with redis-server 7.0's ACL LOAD text when a line is wrong (nothing changes).
    """
    warning = ". WARNING: ACL errors detected, no change to the previously active ACL rules was performed"
    with open(path, "rb") as f:
        data = f.read()
    staged = AclUsers(commands)
    seen: set[str] = set()
    for lineno, raw in enumerate(data.split(b"\n"), 1):
        line = raw.strip(b" \t\r\n")
        if not line or line.startswith(b"#"):
            continue
        argv = splitargs(line)
        if not argv or argv[0] != b"user" or len(argv) < 2:
            raise ValueError(f"{path}:{lineno} should start with user keyword followed by the username{warning}")
        name = argv[1].decode("utf-8", "surrogateescape")
        if not valid_username(name):
            raise ValueError(f"{path}:{lineno}: Usernames can't contain spaces or null characters{warning}")
        if name in seen:
            raise ValueError(f"WARNING: Duplicate user '{name}' found on line {lineno}{warning}")
        seen.add(name)
        rules = [a.decode("utf-8", "surrogateescape") for a in argv[2:]]
        try:
            staged.users[name] = user = User(name)
            staged._apply(user, rules)
        except AclError as exc:
            raise ValueError(f"{path}:{lineno}: Error in applying operation '{exc.op}': {exc.reason}{warning}") from None
    return staged.users


def valid_username(name: str) -> bool:
    return bool(name) and " " not in name and "\0" not in name
