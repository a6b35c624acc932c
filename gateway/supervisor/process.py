"""The supervisor: fork, watch, respawn with backoff, drain; stop when a worker fails at start twice.

Signals are blocked in the supervisor and collected with ``sigtimedwait`` in its main loop, so a handler
never runs in the middle of a fork or a state update: signals only queue, the loop acts. Children unblock
them right after the fork. A worker whose ``main`` raises writes one line saying why to a pipe the
supervisor reads when it reaps the worker: the same reason twice in a row from a worker that never came
up (a port, a certificate, a store it cannot have) stops the gateway with that reason instead of a restart
loop. The loop also replaces a worker whose heartbeat (stamped by its event loop into shared memory) is
older than the timeout: a stopped or wedged worker would keep its listener and let its share of new
connections time out. I/O: fork/kill/waitpid, that pipe, and a small JSON state file for ``gateway
status`` (a failed write, say on a full disk, is logged and retried, never fatal).
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import orjson

__all__ = ["Supervisor", "WorkerSpec"]

log = logging.getLogger("gateway.supervisor")

_HANDLED = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD}
_PR_SET_PDEATHSIG = 1
BACKOFF_FIRST = 0.5
BACKOFF_MAX = 30.0
STABLE_AFTER = 30.0  # a worker that lived this long restarts without backoff
# A worker that lived this long had started, whatever ``came_up`` says; one that did not and failed twice
# in a row for the same reason will not get further by trying again.
START_WINDOW = 10.0
# A worker stamps its first heartbeat once its server runs; until then (imports, the first snapshot) it
# is judged by this allowance, or the heartbeat timeout if that is longer.
FIRST_BEAT_WITHIN = 30.0


@dataclass(slots=True)
class WorkerSpec:
    """One supervised slot. ``main`` runs in the forked child and returns its exit code."""

    name: str
    kind: str  # "control" | "proxy"
    main: Callable[[], int]
    pid: int = 0
    started_at: float = 0.0
    restarts: int = 0
    backoff: float = BACKOFF_FIRST
    restart_at: float | None = None
    exit_codes: list[int] = field(default_factory=list)
    start_failure: str | None = None  # why its last start failed, while it has not come up since
    heartbeat_slot: int | None = None  # where the worker stamps its heartbeat; None: it has none
    killed_hung: bool = False  # SIGKILLed for a missed heartbeat, not reaped yet


def _exit_code(status: int) -> int:
    return os.waitstatus_to_exitcode(status)


class Supervisor:
    def __init__(
        self,
        specs: list[WorkerSpec],
        *,
        grace_period: float,
        state_file: Path | None,
        on_reload: Callable[[], None] | None = None,
        notify: Callable[[str], None] | None = None,
        ready: Callable[[], bool] | None = None,
        watchdog_s: float | None = None,
        came_up: Callable[[WorkerSpec, int], bool] | None = None,
        heartbeat: Callable[[int, int], float | None] | None = None,
        heartbeat_timeout: float = 0.0,
    ) -> None:
        self.specs = specs
        self.grace_period = grace_period
        self.state_file = state_file
        self.on_reload = on_reload
        self.notify = notify or (lambda _msg: None)
        self.ready = ready  # says when every worker serves; READY=1 goes out once it does
        self.watchdog_s = watchdog_s
        # (slot, pid) -> the monotonic time that process last stamped the slot, None if never
        self.heartbeat = heartbeat
        self.heartbeat_timeout = heartbeat_timeout
        self.started_at = time.time()
        self.extra_state: dict[str, object] = {}
        self._stopping = False
        self.came_up = came_up  # whether the worker (spec, pid) got as far as serving
        self.fatal: str | None = None  # why the gateway stops on its own
        self._failures_r, self._failures_w = os.pipe()
        os.set_blocking(self._failures_r, False)
        # A worker never waits on a full pipe (64 KiB of unread reasons); it skips the report instead.
        os.set_blocking(self._failures_w, False)
        self._failure_text = b""
        self._state_failing = False

    # -- children -------------------------------------------------------------------------------
    def _spawn(self, spec: WorkerSpec) -> None:
        pid = os.fork()
        if pid == 0:  # child
            code = 1
            try:
                os.close(self._failures_r)
                signal.pthread_sigmask(signal.SIG_SETMASK, set())
                for sig in _HANDLED:
                    signal.signal(sig, signal.SIG_DFL)
                # Interactive Ctrl-C reaches the whole process group; the supervisor decides what it means.
                signal.signal(signal.SIGINT, signal.SIG_IGN)
                _die_with_parent()
                code = spec.main()
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
            except BaseException as exc:
                log.exception("worker %s crashed", spec.name)
                self._report_failure(exc)
                code = 1
            finally:
                os._exit(code)
        spec.pid = pid
        spec.started_at = time.monotonic()
        spec.restart_at = None
        spec.killed_hung = False
        log.info("started %s worker %s pid=%d", spec.kind, spec.name, pid)

    def _report_failure(self, exc: BaseException) -> None:
        """In the child: one line ``pid TAB reason`` (under PIPE_BUF, so written whole or not at all)."""
        first = (str(exc).strip().splitlines() or [""])[0]
        reason = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
        line = f"{os.getpid()}\t{reason[:1000]}\n".encode(errors="replace")
        try:
            os.write(self._failures_w, line)
        except OSError:
            pass

    def _failure_of(self, pid: int) -> str | None:
        """The reason the worker ``pid`` reported, if it did; reads what the pipe holds."""
        while True:
            try:
                chunk = os.read(self._failures_r, 65536)
            except BlockingIOError:
                break
            if not chunk:
                break
            self._failure_text += chunk
        found: str | None = None
        *lines, self._failure_text = self._failure_text.split(b"\n")
        kept = []
        for raw in lines:
            who, _, reason = raw.decode(errors="replace").partition("\t")
            if who == str(pid):
                found = reason
            elif who.isdigit() and any(s.pid == int(who) for s in self.specs):
                kept.append(raw)  # a worker that is being reaped next
        self._failure_text = b"".join(line + b"\n" for line in kept) + self._failure_text
        return found

    def spawn(self, spec: WorkerSpec) -> None:
        self._spawn(spec)
        self.write_state()

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            for spec in self.specs:
                if spec.pid == pid:
                    self._on_exit(spec, _exit_code(status))
                    break

    def _on_exit(self, spec: WorkerSpec, code: int) -> None:
        pid, spec.pid = spec.pid, 0
        spec.exit_codes = ([*spec.exit_codes, code])[-10:]
        reason = self._failure_of(pid)
        if self._stopping:
            log.info("%s worker %s exited with %d", spec.kind, spec.name, code)
            return
        lived = time.monotonic() - spec.started_at
        came_up = lived >= START_WINDOW or (self.came_up is not None and self.came_up(spec, pid))
        if came_up or reason is None:
            spec.start_failure = None
        elif reason == spec.start_failure:
            self.fatal = f"{spec.kind} worker {spec.name} failed at start twice in a row: {reason}"
            log.error("%s; stopping the gateway", self.fatal)
            return
        else:
            spec.start_failure = reason
        if lived >= STABLE_AFTER:
            spec.backoff = BACKOFF_FIRST
        delay = spec.backoff
        spec.backoff = min(spec.backoff * 2, BACKOFF_MAX)
        spec.restart_at = time.monotonic() + delay
        spec.restarts += 1
        # Said at once, not at the respawn (which may be up to BACKOFF_MAX away): `gateway status` shows
        # the worker down and counted, never the dead pid.
        self.write_state()
        log.warning(
            "%s worker %s exited with %d after %.1fs; restarting in %.1fs",
            spec.kind,
            spec.name,
            code,
            lived,
            delay,
        )

    def poll(self) -> None:
        """Reap exited workers and restart those due; for waits before ``run`` (the first snapshot)."""
        self._reap()
        if self.fatal is None:
            self._restart_due()

    def _restart_due(self) -> None:
        now = time.monotonic()
        for spec in self.specs:
            if spec.pid == 0 and spec.restart_at is not None and spec.restart_at <= now:
                self._spawn(spec)
                self.write_state()

    # -- state ------------------------------------------------------------------------------------
    def write_state(self) -> None:
        if self.state_file is None:
            return
        state = {
            **self.extra_state,
            "supervisor_pid": os.getpid(),
            "started_at": self.started_at,
            "stopping": self._stopping,
            "fatal": self.fatal,
            "workers": [
                {
                    "name": s.name,
                    "kind": s.kind,
                    "pid": s.pid,
                    "restarts": s.restarts,
                    "uptime": round(time.monotonic() - s.started_at, 1) if s.pid else 0.0,
                    "exit_codes": s.exit_codes,
                    "start_failure": s.start_failure,
                }
                for s in self.specs
            ],
        }
        tmp = self.state_file.with_suffix(".tmp")
        try:
            tmp.write_bytes(orjson.dumps(state))
            os.replace(tmp, self.state_file)
        except OSError as exc:
            # A full or read-only disk must not stop the supervisor, and with it every worker: the file is
            # only for ``gateway status``, which then shows the last state written. Logged once an outage.
            if not self._state_failing:
                log.error("state file %s not written (retrying every 2 s): %s", self.state_file, exc)
                self._state_failing = True
            return
        if self._state_failing:
            log.info("state file %s written again", self.state_file)
            self._state_failing = False

    # -- main loop --------------------------------------------------------------------------------
    @staticmethod
    def block_signals() -> None:
        """Call before creating anything the children inherit: from here on signals only queue."""
        signal.pthread_sigmask(signal.SIG_BLOCK, _HANDLED)

    def wait_signal(self, timeout: float) -> int | None:
        info = signal.sigtimedwait(_HANDLED, timeout)
        return info.si_signo if info is not None else None

    def run(self) -> int:
        """Watch the children until SIGTERM/SIGINT, then drain. Returns the exit code (0 on a clean drain)."""
        for spec in self.specs:
            if spec.pid == 0:
                self._spawn(spec)
        self.write_state()
        last_state = time.monotonic()
        ready_sent = False
        next_pet = 0.0
        while True:
            if not ready_sent and (self.ready is None or self.ready()):
                self.notify("READY=1")
                self.notify(
                    f"STATUS=serving with {sum(1 for s in self.specs if s.kind == 'proxy')} proxy workers"
                )
                ready_sent = True
            if self.watchdog_s is not None and time.monotonic() >= next_pet:
                # Petted from the loop that watches the workers: a stuck supervisor misses it.
                self.notify("WATCHDOG=1")
                next_pet = time.monotonic() + self.watchdog_s / 2
            sig = self.wait_signal(0.25)
            if sig == signal.SIGCHLD:
                self._reap()
            elif sig == signal.SIGHUP:
                log.info("SIGHUP: reloading configuration")
                if self.on_reload is not None:
                    self.on_reload()
            elif sig in (signal.SIGTERM, signal.SIGINT):
                return self.drain()
            self._reap()
            if self.fatal is not None:
                self.drain()
                return 1
            self._restart_due()
            self._replace_hung()
            if time.monotonic() - last_state > 2.0:
                self.write_state()
                last_state = time.monotonic()

    def _replace_hung(self) -> None:
        """SIGKILL every worker whose heartbeat is older than the timeout; reaping then respawns it like
        any dead worker. A stopped or wedged worker still holds its listener, and the kernel keeps handing
        it its share of new connections, which would time out: replacing it is what serves them."""
        if self.heartbeat is None or self.heartbeat_timeout <= 0:
            return
        now = time.monotonic()
        for spec in self.specs:
            if not spec.pid or spec.heartbeat_slot is None or spec.killed_hung:
                continue
            beat = self.heartbeat(spec.heartbeat_slot, spec.pid)
            if beat is None:  # not serving yet: the first beat has its own allowance
                silent = now - spec.started_at
                allowed = max(FIRST_BEAT_WITHIN, self.heartbeat_timeout)
            else:
                silent, allowed = now - beat, self.heartbeat_timeout
            if silent <= allowed:
                continue
            log.error(
                "%s worker %s pid=%d missed its heartbeat for %.1fs (timeout %.1fs): killing it",
                spec.kind,
                spec.name,
                spec.pid,
                silent,
                allowed,
            )
            try:
                os.kill(spec.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            spec.killed_hung = True

    def signal_kind(self, kind: str, sig: int) -> None:
        for spec in self.specs:
            if spec.kind == kind and spec.pid:
                try:
                    os.kill(spec.pid, sig)
                except ProcessLookupError:
                    pass

    def drain(self) -> int:
        """Stop proxies first (they finish in-flight requests and streams), then the control worker."""
        self._stopping = True
        self.notify("STOPPING=1")
        self.notify("STATUS=draining")
        self.write_state()
        log.info("draining: waiting up to %.0fs for in-flight requests", self.grace_period)
        self.signal_kind("proxy", signal.SIGTERM)
        self._wait_kind("proxy", self.grace_period)
        self.signal_kind("control", signal.SIGTERM)
        self._wait_kind("control", 10.0)
        self.write_state()
        log.info("stopped")
        return 0

    def _wait_kind(self, kind: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while any(s.pid for s in self.specs if s.kind == kind):
            left = deadline - time.monotonic()
            if left <= 0:
                for spec in self.specs:
                    if spec.kind == kind and spec.pid:
                        log.warning("%s did not stop within the grace period: killing it", spec.name)
                        try:
                            os.kill(spec.pid, signal.SIGKILL)
                        except ProcessLookupError:
                            pass
                deadline = time.monotonic() + 5.0
                timeout = 5.0
            self.wait_signal(min(max(left, 0.05), 0.25))  # SIGCHLD wakes us early; others are ignored now
            self._reap()


def _die_with_parent() -> None:
    """Ask the kernel to SIGTERM this child when the supervisor dies, so workers never outlive it."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    except (OSError, AttributeError) as exc:
        if getattr(exc, "errno", None) not in (None, errno.EINVAL):
            log.debug("prctl(PR_SET_PDEATHSIG) unavailable: %s", exc)
