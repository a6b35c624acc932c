// Fleet: every host that reported recently, its workers, and each backend's health, load, engine queue
// and admission gate, refreshed every few seconds.

import { DASH, badge, fmtDuration, fmtNum, fmtTime, h, section, table } from "./dom.js";

const REFRESH_MS = 3000;
const RECENT_ERROR_S = 30; // a backend that failed this recently is shown as failing

// Active probes (healthy: false) first, then the workers' own view: failures in the last few seconds.
function backendHealth(host, b) {
  if (b.healthy === false) return badge("unhealthy", "bad");
  const now = host.reported_at || Date.now() / 1000;
  if (b.last_error_at && now - b.last_error_at < RECENT_ERROR_S) return badge("failing", "bad");
  if (b.answered === 0 && b.failed === 0) return badge("idle", "neutral");
  return badge("ok", "ok");
}

function kvCache(value) {
  if (typeof value !== "number") return DASH;
  return value <= 1 ? `${(value * 100).toFixed(0)} %` : fmtNum(value);
}

function engineQueue(engine) {
  if (!engine) return DASH;
  const kind = engine.kind ? `${engine.kind}: ` : "";
  return `${kind}${fmtNum(engine.waiting ?? 0)} waiting · ${fmtNum(engine.running ?? 0)} running`;
}

function lastError(b) {
  const seen = b.last_error ? `${b.last_error} (${fmtTime(b.last_error_at)})` : null;
  const probe = b.probe_error ? `probe: ${b.probe_error}` : null;
  return [seen, probe].filter(Boolean).join(" · ") || DASH;
}

function gate(g) {
  if (!g) return DASH;
  return `${fmtNum(g.in_flight ?? 0)} / ${fmtNum(g.ceiling)} · ${fmtNum(g.queued ?? 0)} queued`;
}

// A control plane whose database does not answer serves its last snapshot: degraded, with since when.
function hostStatus(x) {
  if (x.store && x.store.state !== "ok") {
    const since = x.store.since ? ` since ${fmtTime(x.store.since)}` : "";
    return h("span", { title: x.store.error || "" }, badge("degraded", "bad"), ` store unreachable${since}`);
  }
  if (x.control_plane === "unreachable") return badge("degraded", "bad");
  return badge("ok", "ok");
}

function draw(body, hosts) {
  const workers = [];
  const backends = [];
  const credentials = []; // each pool credential (backend/name): its state, never its secret
  for (const host of hosts) {
    const byPid = new Map((host.proxy_workers || []).map((w) => [w.pid, w]));
    for (const w of (host.supervisor && host.supervisor.workers) || []) {
      workers.push({ host: host.host, ...w, stats: byPid.get(w.pid) || null });
    }
    for (const [name, b] of Object.entries(host.backends || {})) {
      backends.push({ ...b, host, name });
    }
    for (const [name, c] of Object.entries(host.credentials || {})) {
      credentials.push({ ...c, host, name });
    }
  }
  body.replaceChildren(
    section(
      "Hosts",
      table(
        [
          ["Host", (x) => x.host],
          ["Role", (x) => x.role],
          ["Listen", (x) => x.listen],
          ["Status", hostStatus],
          ["Reported", (x) => (x.control_plane === "self" ? "this control plane" : `${fmtDuration(x.age_s)} ago`)],
          ["In flight", (x) => fmtNum(x.in_flight), "num"],
          ["Usage pending", (x) => fmtNum(x.usage_pending), "num"],
          ["Workers", (x) => fmtNum(((x.supervisor && x.supervisor.workers) || []).length), "num"],
        ],
        hosts,
        "No host has reported.",
        { id: "hosts" },
      ),
    ),
    section(
      "Backends",
      table(
        [
          ["Host", (x) => x.host.host],
          ["Backend", (x) => x.name],
          ["Health", (x) => backendHealth(x.host, x)],
          ["In flight", (x) => fmtNum(x.in_flight), "num"],
          ["Answered", (x) => fmtNum(x.answered), "num"],
          ["Failed", (x) => fmtNum(x.failed), "num"],
          ["Engine queue", (x) => engineQueue(x.engine)],
          ["KV cache", (x) => kvCache(x.engine && x.engine.kv_cache), "num"],
          ["Gate (in flight / ceiling)", (x) => gate(x.gate)],
          ["Last error", lastError],
        ],
        backends,
        "No backend has been called yet.",
        { id: "backends" },
      ),
    ),
    section(
      "Credentials",
      table(
        [
          ["Host", (x) => x.host.host],
          ["Credential", (x) => x.name],
          ["State", (x) => (x.state === "cooling" ? `cooling ${fmtDuration(x.cooling_for)}` : x.state)],
          ["Answered", (x) => fmtNum(x.answered), "num"],
          ["Failed", (x) => fmtNum(x.failed), "num"],
          ["Last error", lastError],
        ],
        credentials,
        "No pool credential has been used yet.",
        { id: "credentials" },
      ),
    ),
    section(
      "Workers",
      table(
        [
          ["Host", (x) => x.host],
          ["Worker", (x) => x.name],
          ["Kind", (x) => x.kind],
          ["PID", (x) => x.pid, "num"],
          ["Uptime", (x) => fmtDuration(x.uptime)],
          ["Restarts", (x) => fmtNum(x.restarts), "num"],
          ["In flight", (x) => (x.stats ? fmtNum(x.stats.in_flight) : DASH), "num"],
          ["Requests", (x) => (x.stats ? fmtNum(x.stats.requests) : DASH), "num"],
          ["Snapshot", (x) => (x.stats ? `revision ${x.stats.revision}` : DASH)],
        ],
        workers,
        "No workers reported.",
        { id: "workers" },
      ),
    ),
  );
}

export async function render(main, ctx) {
  const status = h("p", { class: "muted", id: "fleet-status" }, "Loading…");
  const body = h("div", { id: "fleet" });
  main.append(h("h1", {}, "Fleet"), status, body);
  const refresh = async () => {
    const data = await ctx.api("GET", "/admin/fleet");
    draw(body, data.hosts);
    status.textContent = `${data.hosts.length} host(s) · updated ${fmtTime(Date.now() / 1000)} · refreshes every ${REFRESH_MS / 1000} s`;
  };
  ctx.every(REFRESH_MS, refresh, main);
  await refresh();
}
