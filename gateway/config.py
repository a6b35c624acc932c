"""Runtime settings of one gateway host: where it listens, how many workers, where its data lives.

``Settings`` is a frozen value built from CLI flags and ``GATEWAY_*`` environment variables; building it
does no I/O. ``load_hash_key`` is the one function here that touches the disk.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from gateway.errors import ConfigError

__all__ = ["Settings", "load_hash_key"]


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    return int(raw) if raw else default


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    try:
        return float(raw) if raw else default
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number") from None


@dataclass(frozen=True, slots=True)
class Settings:
    role: str = "all"  # all | proxy | control
    host: str = "127.0.0.1"
    port: int = 8080
    admin_host: str = "127.0.0.1"
    admin_port: int | None = None  # the control worker's admin port; --role control defaults it to 8081
    control_url: str | None = None  # --role proxy: the control plane's admin URL
    report_interval: float = 10.0  # --role proxy: seconds between health reports to the control plane
    admin_tls_cert: Path | None = None  # serve the admin port over TLS with this certificate chain (PEM)
    admin_tls_key: Path | None = None
    control_ca: Path | None = None  # --role proxy: CA bundle that signed the control plane's certificate
    usage_spool_max_mb: int = 1024  # --role proxy: bound of the on-disk usage spool
    # The control plane's bound on usage records from proxy hosts waiting for the store or being written;
    # past it a batch is answered 503 with Retry-After and stays in its host's spool.
    ingest_queue_max: int = 200_000
    host_id: str | None = None  # this host's id in the fleet; None: generated once into DATA_DIR/host-id
    admin_backlog: int = 2048  # admin port's listen backlog (a connection per proxy host)
    admin_backpressure: int = 2048  # connections the admin/cluster port serves at once
    postgres_pool_size: int = 4  # connections each process keeps to PostgreSQL (the control worker's pool)
    workers: int = field(default_factory=lambda: os.cpu_count() or 1)
    data_dir: Path = Path("var/data")
    config_file: Path | None = None
    database: str | None = None  # None: SQLite file under data_dir
    grace_period: float = 30.0  # seconds SIGTERM waits for in-flight requests and streams
    # Seconds a proxy worker may go without stamping its heartbeat (its event loop does, twice a second)
    # before the supervisor kills and replaces it; 0: never.
    heartbeat_timeout: float = field(default_factory=lambda: _env_float("GATEWAY_HEARTBEAT_TIMEOUT", 5.0))
    backend_cool_down: float = 5.0  # seconds a backend that failed 3 times in a row is skipped; 0: never
    stream_stall_timeout: float = 60.0  # seconds a streamed answer waits for a client that takes no byte
    # Tries of one request, failover targets and pool credentials together, and the pause before the
    # second (doubling for each further one, at most 1 s).
    # Where the control worker POSTs budget alerts (gateway.controlplane.usage.budget_alerts); None: log only.
    budget_alert_webhook: str | None = field(
        default_factory=lambda: os.environ.get("GATEWAY_BUDGET_ALERT_WEBHOOK") or None
    )
    max_attempts: int = field(default_factory=lambda: _env_int("GATEWAY_MAX_ATTEMPTS", 5))
    retry_backoff: float = field(
        default_factory=lambda: float(os.environ.get("GATEWAY_RETRY_BACKOFF", "0.05"))
    )
    event_loop: str = field(
        default_factory=lambda: os.environ.get("GATEWAY_EVENT_LOOP", "uvloop")
    )  # or asyncio
    # Pin proxy worker i to the i-th usable core: "on" always (round robin over the cores), "auto" when
    # there are as many workers as cores, "off" never (the default: pinning slows streams, see worker.py).
    cpu_affinity: str = field(default_factory=lambda: os.environ.get("GATEWAY_CPU_AFFINITY", "off"))
    engine_scrape_interval: float = 2.0  # seconds between reads of the backends' /metrics and probes; 0: off
    drain_delay: float = 0.0  # seconds /readyz says 503 before the listener closes (behind a load balancer)
    # Then, at most this long, until no request came for a quarter second: the clients still sending on
    # kept-alive connections are each told Connection: close before the listener closes (closing.py).
    drain_window: float = 2.0
    max_body_bytes: int = 32 * 1024 * 1024
    snapshot_poll_interval: float = 0.1  # how often a worker checks the published generation
    revision_poll_interval: float = 0.25  # how often the control worker checks the store's revision
    snapshot_segment_bytes: int = field(default_factory=lambda: _env_int("GATEWAY_SNAPSHOT_BYTES", 64 << 20))
    bucket_capacity: int = 65536  # slots in the shared token-bucket table (64 bytes each)
    # (block, backend) pairs the host's prefix index keeps for cache_aware pools (16 bytes each; a power
    # of two): size it like the engines' caches together, in blocks (pages never written take no memory)
    prefix_index_entries: int = field(
        default_factory=lambda: _env_int("GATEWAY_PREFIX_INDEX_ENTRIES", 1 << 20)
    )
    default_completion_tokens: int = 512  # reserved per request without max_tokens, settled after
    disconnect_watch_after: float = 0.25  # seconds a request runs before client disconnects are watched
    backpressure: int = 16384  # concurrent connections per worker granian accepts (idle ones included)
    # The edge (docs/operations.md, "Hostile traffic and faults"): a connection that sends no complete
    # request head within head_timeout seconds is closed; a body with no byte for body_timeout gets 408.
    head_timeout: float = 30.0
    body_timeout: float = 30.0
    body_buffer_bytes: int = 96 * 1024 * 1024  # bytes of large request bodies one worker holds at once
    body_wait: float = 10.0  # seconds a body waits for room in that budget before 503
    # Per client address (after trusted_proxies), across the host's workers; 0 turns a limit off.
    client_max_requests: int = 4096  # concurrent requests
    client_rate: float = 0.0  # requests per second
    client_burst: int = 0  # bucket size of client_rate; 0: twice the rate
    client_slots: int = 8192  # bucket pairs the addresses are hashed into
    trusted_proxies: tuple[str, ...] = ()  # CIDRs whose X-Forwarded-For names the client
    # Request headers (lowercase names) never forwarded to an engine, besides the client credentials the
    # gateway always drops (dataplane/app.py): an operator's own, e.g. an SSO proxy's identity header.
    drop_request_headers: tuple[str, ...] = ()
    usage_records: bool = field(default_factory=lambda: os.environ.get("GATEWAY_USAGE_RECORDS", "1") != "0")
    # Each usage record carries its route trace (every attempt's backend, outcome and times); on by default
    route_trace: bool = field(default_factory=lambda: os.environ.get("GATEWAY_ROUTE_TRACE", "1") != "0")
    # OpenTelemetry: OTLP/HTTP (protobuf) traces endpoint, e.g. http://collector:4318/v1/traces; None: off
    otel_endpoint: str | None = field(
        default_factory=lambda: (
            os.environ.get("GATEWAY_OTEL_ENDPOINT")
            or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            or None
        )
    )
    otel_sample_ratio: float = field(default_factory=lambda: _env_float("GATEWAY_OTEL_SAMPLE_RATIO", 1.0))
    otel_service_name: str = field(default_factory=lambda: os.environ.get("OTEL_SERVICE_NAME", "gateway"))
    otel_queue: int = 4096  # sampled requests waiting for export at most; more are dropped and counted
    recent_requests: int = 1000  # finished requests the control worker keeps in memory (the flight recorder)
    # x-ratelimit-* headers on answers to rate-limited keys; off saves granian's per-header cost
    rate_limit_headers: bool = field(
        default_factory=lambda: os.environ.get("GATEWAY_RATE_LIMIT_HEADERS", "1") != "0"
    )
    inject_stream_usage: bool = True  # ask engines for a stream's usage when the client did not
    usage_ring_slots: int = 4096  # records each proxy worker's ring holds (1 KiB each)
    # 4 KiB slots of each proxy worker's body-log ring (a power of two; 2048: 8 MiB, touched only when used)
    body_ring_slots: int = field(default_factory=lambda: _env_int("GATEWAY_BODY_RING_SLOTS", 2048))
    usage_drain_interval: float = 0.1  # how often the control worker moves records into the store
    budget_refresh_interval: float = 30.0  # how often budgets' base spend is re-read from the store
    log_level: str = "info"
    log_format: str = "text"  # text | json (one JSON object per line, for journald and log shippers)
    access_log: bool = False  # one JSON line per forwarded request on stdout, written by the control slot
    # Usage records older than this many days are purged by the control worker (0: kept forever); never
    # those inside a budget's current window (controlplane/usage/retention.py).
    usage_retention_days: float = field(
        default_factory=lambda: float(os.environ.get("GATEWAY_USAGE_RETENTION_DAYS") or 0)
    )
    usage_purge_interval: float = 300.0  # seconds between the control worker's retention checks

    @property
    def sqlite_path(self) -> Path:
        return self.data_dir / "gateway.sqlite3"

    @property
    def database_url(self) -> str:
        return self.database or f"sqlite:///{self.sqlite_path}"

    @property
    def run_dir(self) -> Path:
        """Where the supervisor keeps its pid and state files for ``gateway status``."""
        return self.data_dir / "run"


def load_hash_key(data_dir: Path) -> bytes:
    """The 32-byte key for hashing API keys.

    ``GATEWAY_HASH_KEY`` (64 hex chars) wins, so that every host of a cluster can share one; otherwise a
    key is created once under the data directory, readable by its owner only.
    """
    raw = os.environ.get("GATEWAY_HASH_KEY")
    if raw:
        try:
            key = bytes.fromhex(raw)
        except ValueError:
            key = b""
        if len(key) != 32:
            raise ValueError("GATEWAY_HASH_KEY must be 64 hex characters (32 bytes)")
        return key
    path = data_dir / "hash.key"
    try:
        key = path.read_bytes()
    except FileNotFoundError:
        data_dir.mkdir(parents=True, exist_ok=True)
        key = secrets.token_bytes(32)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, key)
        finally:
            os.close(fd)
        return key
    if len(key) != 32:
        raise ValueError(f"{path} must hold exactly 32 bytes")
    return key
