"""The directive table: one :class:`~pfxcache.daemon.config.kinds.Directive`
row per setting of pfxcached, in the order the documented
``conf/pfxcached.conf`` lists them.

Adding a setting means adding a row here, then regenerating the file
(``python -m pfxcache.daemon.config > conf/pfxcached.conf``); the engine
(:class:`pfxcache.daemon.config.engine.Config`) and the file generator
(:mod:`pfxcache.daemon.config.conf_file`) derive everything else from the rows.
"""

from __future__ import annotations

import os

from pfxcache.daemon.config.kinds import (
    INT_MAX,
    LONG_MAX,
    UINT_MAX,
    AddressList,
    Bool,
    Computed,
    Directive,
    Directory,
    Enum,
    Inapplicable,
    Int,
    Memory,
    OutputBufferLimits,
    TenantQuotas,
    Percentiles,
    Save,
    String,
)

from pfxcache.daemon.config.partitions import ArenaPartitions
from pfxcache.daemon.config.redis_directives import REDIS_DIRECTIVES
from pfxcache.daemon.store.registry import DEFAULT as DEFAULT_POLICY
from pfxcache.daemon.store.registry import POLICIES, SHIPPED

__all__ = ["ALL_DIRECTIVES", "DIRECTIVES", "REDIS_ONLY"]

_NO_PERSISTENCE = "persistence is not supported"

#: redis-server's maxmemory-policy names and the policy each means here. Every namespace is a key
#: with the same standing, so the volatile-* forms act as the allkeys-* ones; pfxcached has no
#: random eviction and no TTL order among pages, so those become LRU, which does at least as well
#: on any workload with reuse. noeviction is itself: writes answer -OOM when the arena is full.
_REDIS_POLICIES = (
    ("allkeys-lru", "lru"), ("volatile-lru", "lru"), ("allkeys-lfu", "lfu"), ("volatile-lfu", "lfu"),
    ("allkeys-random", "lru"), ("volatile-random", "lru"), ("volatile-ttl", "lru"),
)

DIRECTIVES: tuple[Directive, ...] = (
    # --- network ---
    Directive(
        name="bind", kind=AddressList(), default=("127.0.0.1",),
        doc="Addresses (IPv4 or IPv6) to accept TCP clients on, separated by spaces. "
        "The default takes local IPv4 clients only, unlike Redis's \"* -::*\"; "
        "use 0.0.0.0 and/or :: to listen on every interface, and set requirepass then.",
    ),
    Directive(
        name="port", kind=Int(), default=6390, minimum=0, maximum=65535,
        doc="TCP port to accept clients on; 0 asks the kernel for a free port, which the "
        "\"Ready to accept connections\" log line reports (unlike Redis, where 0 opens no TCP "
        "listener). The default differs from Redis's 6379 so that both can run on one host.",
    ),
    Directive(
        name="unixsocket", kind=String(), default="", mutable=False,
        doc="Path of a Unix domain socket to accept clients on as well; \"\" opens none.",
    ),
    Directive(
        name="unixsocketperm", kind=Int(base=8), default=0, minimum=0, maximum=0o777, mutable=False,
        doc="Permission bits (octal, e.g. 700) given to the Unix socket; 0 leaves them to the umask.",
    ),
    Directive(
        name="tcp-backlog", kind=Int(), default=511, minimum=0, maximum=INT_MAX, mutable=False,
        doc="Backlog of the listening sockets (listen(2)); the kernel caps it at net.core.somaxconn.",
    ),
    Directive(
        name="tcp-keepalive", kind=Int(), default=300, minimum=0, maximum=INT_MAX,
        doc="Seconds between TCP keepalive probes to clients (SO_KEEPALIVE); 0 sends none. "
        "Detects dead peers and keeps idle connections alive through middleboxes.",
    ),
    Directive(
        name="timeout", kind=Int(), default=0, minimum=0, maximum=INT_MAX,
        doc="Close a client connection after it has been idle this many seconds; 0 never does.",
    ),
    Directive(
        name="protected-mode", kind=Bool(), default=True,
        doc="When yes and no requirepass is set, refuse clients that connect over TCP "
        "from other than a loopback address.",
    ),
    # --- limits ---
    Directive(
        name="maxclients", kind=Int(), default=10000, minimum=1, maximum=UINT_MAX,
        doc="Most clients connected at once; more are refused with \"ERR max number of clients reached\".",
    ),
    Directive(
        name="proto-max-bulk-len", kind=Memory(), default=512 * 1024**2, minimum=1024**2, maximum=LONG_MAX,
        doc="Largest bulk string (one argument, such as a key or a value) a client may send.",
    ),
    Directive(
        name="client-query-buffer-limit", kind=Memory(), default=1024**3, minimum=1024**2, maximum=LONG_MAX,
        doc="Most bytes of not yet executed input one client may have buffered; "
        "a client going past it is disconnected.",
    ),
    Directive(
        name="client-output-buffer-limit", kind=OutputBufferLimits(),
        default=((0, 0, 0), (256 * 1024**2, 64 * 1024**2, 60), (32 * 1024**2, 8 * 1024**2, 60)),
        doc="Disconnect a client that does not read its replies: once the reply bytes the daemon "
        "holds for it (not yet accepted by the socket) exceed the hard limit, or stay above the soft "
        "limit for soft-seconds. As in Redis, \"normal 0 0 0\" (the default) sets no limit; only the "
        "normal class applies to pfxcached (slave and pubsub are accepted and shown for compatibility).",
    ),
    # --- security ---
    Directive(
        name="requirepass", kind=String(), default="",
        doc="Password that clients must give with AUTH before other commands; \"\" disables "
        "authentication. As in Redis, CONFIG GET shows it: keep CONFIG away from untrusted clients.",
    ),
    Directive(
        name="aclfile", kind=String(), default="", mutable=False,
        doc="File of ACL users loaded at startup, in Redis's ACL file format: one "
        "\"user <name> <rule> ...\" line per user, e.g. \"user alice on >secret ~tenant-a:* +@pfx -@admin\" "
        "(blank lines and # comments are skipped). \"\" for none. A relative path is relative to dir.",
    ),
    # --- logging and process ---
    Directive(
        name="loglevel", kind=Enum(("debug", "verbose", "notice", "warning", "nothing")), default="notice",
        doc="How much to log: debug (a lot), verbose, notice (for production), "
        "warning (only very important messages) or nothing.",
    ),
    Directive(
        name="logfile", kind=String(), default="", mutable=False,
        doc="File to append the log to; \"\" logs to standard output.",
    ),
    Directive(
        name="pidfile", kind=String(), default="", mutable=False,
        doc="File to write pfxcached's process id to at startup (and remove at exit); \"\" writes none.",
    ),
    Directive(
        name="dir", kind=Directory(),
        default=Computed(os.getcwd, doc="the directory pfxcached is started in", conf="./"),
        protected=True,
        doc="Working directory; relative paths (logfile, pidfile, unixsocket) are taken from it. "
        "CONFIG GET reports it as an absolute path; CONFIG SET refuses it, as Redis 7 does "
        "for protected configs.",
    ),
    Directive(
        name="hz", kind=Int(clamp=(1, 500)), default=10, minimum=0, maximum=INT_MAX,
        doc="How many times a second background tasks (closing idle clients, statistics) run. "
        "Higher is more responsive and uses more CPU.",
    ),
    Directive(
        name="shutdown-timeout", kind=Int(), default=10, minimum=0, maximum=INT_MAX,
        doc="Seconds a graceful shutdown (SHUTDOWN, SIGTERM, SIGINT) waits for clients' "
        "in-flight work before exiting anyway.",
    ),
    # --- the prefix store ---
    Directive(
        name="maxmemory", kind=Memory(), default=256 * 1024**2, minimum=1024, maximum=LONG_MAX, mutable=False,
        doc="Size of the block arena: the memory budget of every namespace together. It is "
        "reserved at startup and cut into maxmemory / block-bytes blocks.",
    ),
    Directive(
        name="maxmemory-policy", kind=Enum((*SHIPPED, "noeviction"), synonyms=_REDIS_POLICIES), default=DEFAULT_POLICY,
        doc="Which unpinned leaf pages go first when blocks are needed: "
        + ", ".join(f"{name} ({POLICIES[name].summary})" for name in SHIPPED)
        + ", noeviction (never evict: writes answer -OOM once the arena is full; PFXEVICT still works). "
        "redis-server's names are accepted: allkeys-lru and volatile-lru mean lru, allkeys-lfu and "
        "volatile-lfu lfu, allkeys-random, volatile-random and volatile-ttl lru.",
    ),
    Directive(
        name="page-size", kind=Int(), default=16, minimum=1, maximum=1 << 20, mutable=False,
        doc="Tokens per page. Only full pages are cached and matches are whole pages; each "
        "cached page owns one block.",
    ),
    Directive(
        name="block-bytes", kind=Memory(), default=16384, minimum=1, maximum=LONG_MAX, mutable=False,
        doc="Bytes of KV data per page (one block): opaque to the daemon, fixed by the model "
        "(layers x 2 x kv heads x head dim x page-size x dtype size).",
    ),
    Directive(
        name="shards", kind=Int(), default=16, minimum=1, maximum=4096, mutable=False,
        doc="Shards of each namespace's tree, each behind its own reader-writer lock: a "
        "writer on one shard never delays readers of another.",
    ),
    Directive(
        name="lease-ttl", kind=Int(), default=30000, minimum=0, maximum=7 * 24 * 3600 * 1000,
        doc="Milliseconds a lease (blocks pinned by PFXGET or PFXALLOC) lives unless released "
        "or renewed first; the TTL option of those commands overrides it. 0: leases live "
        "until released or their connection closes.",
    ),
    Directive(
        name="client-lease-limit", kind=Int(), default=100000, minimum=0, maximum=INT_MAX,
        doc="Most leases one connection may hold at once (a lease and its pins cost memory that "
        "is not in the arena); past it PFXGET and PFXALLOC answer -ERR until some are released. "
        "0: no limit.",
    ),
    Directive(
        name="tenant-quota", kind=TenantQuotas(), default=(),
        doc="Per-tenant limits, by namespace pattern (the same glob as the tenant's ACL key "
        "pattern, e.g. \"tenant-a:* 100000 5000 1000\"): the cached pages, the blocks under "
        "lease (PFXALLOC blocks plus the pages each lookup lease pins) and the leases that the "
        "namespaces matching it may hold together; 0 is no limit. An insert past the page limit "
        "evicts that tenant's own pages, never another's; a lease past a limit is refused with "
        "-OOM. A namespace falls under the first matching pattern. CONFIG SET changes the "
        "patterns it names (three zeros remove one; \"\" removes all).",
    ),
    Directive(
        name="evict-low-watermark", kind=Int(), default=5, minimum=0, maximum=90,
        doc="Percent of the arena's blocks a background task keeps free by evicting ahead "
        "of need, so that writes rarely wait for eviction; 0 evicts only on demand.",
    ),
    Directive(
        name="lfu-log-factor", kind=Int(), default=10, minimum=0, maximum=INT_MAX,
        doc="How slowly a namespace's access counter (OBJECT FREQ, redis-cli --hotkeys) grows, "
        "as in Redis: an access adds one with odds 1 / ((counter - 5) x factor + 1).",
    ),
    Directive(
        name="lfu-decay-time", kind=Int(), default=1, minimum=0, maximum=INT_MAX,
        doc="Minutes without access after which a namespace's access counter drops by one, as "
        "in Redis; 0 never decays.",
    ),
    Directive(
        name="prompt-max-tokens", kind=Int(), default=1 << 20, minimum=1, maximum=INT_MAX,
        doc="Most tokens one PFXGET, PFXSET or PFXEVICT may carry.",
    ),
    Directive(
        name="arena", kind=Enum(("shm", "memory", "cuda")), default="shm", mutable=False,
        doc="Where blocks live: shm, a sealed memfd (it cannot be shrunk: no worker can crash "
        "the daemon) that workers of the daemon's user on this host map zero-copy through "
        "/proc/<pid>/fd/<n> (its PFXINFO path) and other local workers receive over the unix "
        "socket (PFXATTACH; see arena-partition); memory, private to the daemon; cuda, "
        "one allocation on the GPU arena-device that CUDA processes open through its IPC "
        "handle (needs CuPy: pip install pfxcache[cuda12] or [cuda13]).",
    ),
    Directive(
        name="arena-device", kind=Int(), default=0, minimum=0, maximum=1023, mutable=False,
        doc="The CUDA device (ordinal, as in CUDA_VISIBLE_DEVICES order) that holds the arena "
        "when arena is cuda; ignored otherwise.",
    ),
    Directive(
        name="arena-name", kind=String(), default="pfxcache", mutable=False,
        doc="Prefix of the shared-memory file's name. At startup, files with this prefix left "
        "by a daemon that no longer runs are removed.",
    ),
    Directive(
        name="arena-partition", kind=ArenaPartitions(), default=(), mutable=False,
        doc="Per-tenant partitions of the shm arena, by namespace pattern (the glob of the tenant's "
        "ACL key pattern) and size (blocks, or bytes with a unit: \"tenant-a:* 64mb\"), one line "
        "each, in block order. The namespaces matching a partition (the first that matches) store "
        "only in its blocks, and a full partition evicts only its own pages; the others share the "
        "rest of maxmemory. Each partition is a memfd of its own that PFXATTACH hands, over the "
        "unix socket, only to users whose key patterns cover it (read-only for users without PFXALLOC). "
        "Sizes are rounded up to whole memory pages. At most 127; shm arena only; startup only.",
    ),
    # --- KV events: what the store caches, for KV-aware routers (vLLM's ZMQ format) and pub/sub ---
    Directive(
        name="kv-events-endpoint", kind=String(), default="",
        doc="ZMQ PUB address the daemon binds to publish KV events in vLLM's wire format "
        "(BlockStored, BlockRemoved, AllBlocksCleared), e.g. tcp://127.0.0.1:5557; \"\" (the default) "
        "publishes nothing. Routers such as Dynamo's KV indexer subscribe to it; each event names its "
        "namespace as lora_name. CONFIG SET rebinds at once.",
    ),
    Directive(
        name="kv-events-replay-endpoint", kind=String(), default="",
        doc="ZMQ ROUTER address for replays: a consumer that missed batches (or joined late) asks for "
        "the buffered ones from a sequence number on, as vLLM's replay socket answers. \"\" for none.",
    ),
    Directive(
        name="kv-events-topic", kind=String(), default="",
        doc="The topic frame of every KV events message (subscribers filter on its prefix).",
    ),
    Directive(
        name="kv-events-replay-buffer", kind=Int(), default=10000, minimum=1, maximum=INT_MAX,
        doc="Batches of KV events kept for the replay socket (the newest ones).",
    ),
    Directive(
        name="kv-events-queue-size", kind=Int(), default=100000, minimum=1, maximum=INT_MAX,
        doc="KV events waiting for the publisher thread at most; past it events are dropped and "
        "counted (INFO kv_events_dropped) rather than slowing the daemon.",
    ),
    Directive(
        name="kv-events-hwm", kind=Int(), default=100000, minimum=0, maximum=INT_MAX,
        doc="Batches the PUB socket queues for one subscriber that does not keep up (ZMQ's send "
        "high-water mark, as vLLM's hwm); past it that subscriber misses batches, sees the gap in seq and "
        "can replay them. 0: no limit. CONFIG SET rebinds the sockets.",
    ),
    Directive(
        name="kv-events-pubsub", kind=Bool(), default=False,
        doc="Also publish the store's events on Redis pub/sub, one channel per namespace: "
        "__kvevents@0__:<namespace>, with messages \"stored <parent|-> <hash> ...\", "
        "\"removed <hash> ...\" and \"cleared\" (hashes in hex), as keyspace notifications do for keys.",
    ),
    # --- metrics ---
    Directive(
        name="metrics-port", kind=Int(), default=0, minimum=0, maximum=65535, mutable=False,
        doc="TCP port of the Prometheus metrics endpoint, http://<metrics-bind>:<port>/metrics "
        "(token hits and misses, pages, blocks, leases, evictions, memory, command latencies); "
        "0, the default, serves none.",
    ),
    Directive(
        name="metrics-bind", kind=AddressList(), default=("127.0.0.1",), mutable=False,
        doc="Addresses (IPv4 or IPv6) the metrics endpoint listens on, separated by spaces. "
        "Loopback by default: the metrics name namespaces, which may name tenants.",
    ),
    Directive(
        name="metrics-namespaces", kind=Int(), default=100, minimum=0, maximum=100_000,
        doc="Most namespaces the metrics endpoint labels one by one (each is a time series per "
        "metric for Prometheus); a namespace keeps its label while it exists, and the others "
        "are summed under namespace=\"_other\".",
    ),
    # --- operating it: SLOWLOG, LATENCY, ACL LOG, DEBUG ---
    Directive(
        name="slowlog-log-slower-than", kind=Int(), default=10000, minimum=-1, maximum=LONG_MAX,
        doc="Log to SLOWLOG every command that ran for at least this many microseconds "
        "(wall time: an async command's waits for locks and copies count); 0 logs every "
        "command, -1 none.",
    ),
    Directive(
        name="slowlog-max-len", kind=Int(), default=128, minimum=0, maximum=LONG_MAX,
        doc="Entries SLOWLOG keeps; the oldest go first.",
    ),
    Directive(
        name="latency-monitor-threshold", kind=Int(), default=0, minimum=0, maximum=LONG_MAX,
        doc="Record a LATENCY event for every command, eviction cycle, expiry cycle, arena copy "
        "and PFXCHECK fork that takes at least this many milliseconds; 0 records none.",
    ),
    Directive(
        name="acllog-max-len", kind=Int(), default=128, minimum=0, maximum=LONG_MAX,
        doc="Entries ACL LOG keeps (denied commands, keys and AUTHs); the oldest go first.",
    ),
    Directive(
        name="latency-tracking", kind=Bool(), default=True,
        doc="Keep a latency histogram per command, shown by INFO latencystats.",
    ),
    Directive(
        name="latency-tracking-info-percentiles", kind=Percentiles(), default=(50.0, 99.0, 99.9),
        doc="The percentiles INFO latencystats shows for each command (interpolated within the "
        "histogram buckets the metrics endpoint exports).",
    ),
    Directive(
        name="enable-debug-command", kind=Enum(("no", "yes", "local")), default="no", mutable=False,
        doc="Whether DEBUG (DEBUG SLEEP) may run: no, yes, or local (from loopback and unix "
        "socket clients only), as in Redis.",
    ),
    # --- Redis compatibility: accepted so that Redis tools and configs work ---
    Directive(
        name="databases", kind=Int(), default=1, minimum=1, maximum=INT_MAX, mutable=False,
        allowed=(1,), refusal="only one database (db 0) is supported", lenient=True,
        doc="Number of databases. pfxcached has only db 0: another value in a config file is "
        "ignored with a warning at startup.",
    ),
    Directive(
        name="save", kind=Save(), default="",
        doc="Redis's snapshot schedule: save <seconds> <changes> [<seconds> <changes> ...] writes a "
        "snapshot of the arena (every cached page and the trees) in the background when, for one pair, "
        "that many pages were stored or evicted and that many seconds passed since the last save; "
        "shutdown then saves too. \"\" (the default): only SAVE, BGSAVE and SHUTDOWN SAVE write one. "
        "A daemon started on a directory holding a snapshot loads it before serving.",
    ),
    Directive(
        name="dbfilename", kind=String(), default="dump.pfx", protected=True,
        doc="The snapshot's file name, in dir (a pfxcache snapshot, not an RDB file); "
        "<dbfilename>.lock beside it keeps a second daemon off it.",
    ),
    Directive(
        name="disk-tier-size", kind=Memory(), default=0, minimum=0, maximum=LONG_MAX, mutable=False,
        doc="Bytes of disk under the arena for pages evicted from RAM (the disk tier; docs/operating.md"
        "#the-disk-tier). 0 (the default): no disk tier, an evicted page is gone. PFXGET reads pages "
        "that continue a prompt's RAM match back from disk in the same round trip.",
    ),
    Directive(
        name="disk-tier-path", kind=String(), default="", mutable=False,
        doc="Directory of the disk tier's files (a pfxtier/ folder is made in it); \"\" (the default): dir. "
        "One daemon per path: a second one refuses to start.",
    ),
    Directive(
        name="disk-tier-write", kind=Enum(("back", "through")), default="back", mutable=False,
        doc="When pages reach the disk tier: back (the default) when the eviction policy takes them out of "
        "RAM; through also as soon as PFXSET stores them, so a kill -9 loses only pages still queued "
        "(docs/benchmarks.md#scriptsbench-tier-the-disk-tier measures both).",
    ),
    Directive(
        name="disk-tier-fsync", kind=Enum(("batch", "no")), default="batch", mutable=False,
        doc="batch (the default): each batch of pages written to the disk tier is fdatasync'ed before "
        "its pages can be found there, so a page served from disk survived power loss; no leaves it "
        "to the kernel (faster, and a crash may cost pages, never a wrong byte: every page is verified).",
    ),
    Directive(
        name="disk-tier-read-timeout", kind=Int(), default=500, minimum=1, maximum=INT_MAX,
        doc="Milliseconds a PFXGET waits for pages read back from the disk tier; later, those pages "
        "are a miss for this request (the read still lands for the next one).",
    ),
    Directive(
        name="disk-tier-queue", kind=Memory(), default=64 * 1024**2, minimum=0, maximum=LONG_MAX,
        doc="Bytes of evicted pages waiting to be written to the disk tier; pages evicted while it is "
        "full are dropped (INFO tiers: tier_disk_demotions_skipped) rather than slow down a write.",
    ),
    Directive(
        name="remote-tier", kind=String(), default="", mutable=False,
        doc="The shared tier under the arena and the disk tier (docs/operating.md#the-shared-tier): "
        "redis://[user:password@]host:port (one Redis or Valkey) or "
        "redis-cluster://[user:password@]host:port[,host:port...] (seed nodes of a Redis Cluster). "
        "Every daemon given the same URL shares the pages it stores; \"\" (the default): none. "
        "As requirepass, CONFIG GET shows it; the log never shows its password.",
    ),
    Directive(
        name="remote-tier-password", kind=String(), default="", mutable=False,
        doc="The shared tier's password, when it is not in the remote-tier URL (\"\" : the URL's).",
    ),
    Directive(
        name="remote-tier-timeout", kind=Int(), default=50, minimum=1, maximum=INT_MAX, mutable=False,
        doc="Milliseconds a PFXGET waits for pages fetched from the shared tier (and each call's socket "
        "timeout); later, those pages are a miss for this request.",
    ),
    Directive(
        name="remote-tier-queue", kind=Memory(), default=64 * 1024**2, minimum=0, maximum=LONG_MAX,
        doc="Bytes of pages waiting to be written to the shared tier; pages stored or evicted while it is "
        "full, or while the cluster is down, are dropped (INFO tiers: tier_remote_drops), never waited for.",
    ),
    Directive(
        name="remote-tier-ttl", kind=Int(), default=0, minimum=0, maximum=INT_MAX, mutable=False,
        doc="Seconds a page written to the shared tier lives there (SET EX); 0 (the default): until the "
        "cluster's own maxmemory-policy evicts it.",
    ),
    Directive(
        name="remote-tier-shutdown-flush", kind=Int(), default=2000, minimum=0, maximum=INT_MAX,
        doc="Milliseconds a graceful shutdown (SHUTDOWN, SIGTERM) spends writing the shared tier's queue "
        "out; what is left then is dropped and counted (the log says both). Also PFXTIER FLUSH's default "
        "wait. 0: the queue is dropped. A kill -9 loses the queue whatever this says.",
    ),
    Directive(
        name="remote-tier-write", kind=Enum(("back", "through")), default="through", mutable=False,
        doc="When pages reach the shared tier: through (the default) as soon as PFXSET stores them, so "
        "every daemon of the fleet finds them at once, and when evicted if not written yet; back only "
        "when the eviction policy takes them out of RAM.",
    ),
    Directive(
        name="appendonly", kind=Bool(), default=False, allowed=(False,), refusal=_NO_PERSISTENCE,
        doc="Redis's append-only file. pfxcached keeps nothing on disk, so only no is accepted.",
    ),
    Directive(
        name="daemonize", kind=Bool(), default=False, mutable=False, allowed=(False,),
        refusal="pfxcached always runs in the foreground (use systemd, a container or nohup)", lenient=True,
        doc="Redis's run-in-the-background switch. pfxcached always runs in the foreground: yes "
        "in a config file is ignored with a warning at startup.",
    ),
)

_OURS = {name for d in DIRECTIVES for name in (d.name, *d.aliases)}

#: Every other directive of redis-server 7.0.15: accepted from redis.conf, shown by CONFIG GET,
#: no effect (reported once at startup when a config sets it).
REDIS_ONLY: tuple[Directive, ...] = tuple(
    Directive(
        name=name, kind=Inapplicable(), default=default, mutable=False,
        doc="A redis-server directive with no use in pfxcached: accepted so a redis.conf works, no effect.",
    )
    for name, default in REDIS_DIRECTIVES.items()
    if name not in _OURS
)

#: What the daemon's configuration holds: pfxcached's own rows, then the redis-server-only ones.
ALL_DIRECTIVES = DIRECTIVES + REDIS_ONLY
