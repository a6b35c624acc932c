// Requests: the ones in flight on every worker, the last finished ones (the control worker's flight
// recorder), and one request's route trace: each attempt's backend, outcome, times and why the next was
// tried, and its logged bodies (redacted, for a key holding bodies:read). Looked up by the x-request-id the
// client got; refreshed every few seconds.

import { DASH, badge, clear, field, fmtNum, fmtTime, h, section, table } from "./dom.js";

const REFRESH_MS = 3000;

function ms(value) {
  return value === null || value === undefined ? DASH : `${Number(value).toFixed(1)} ms`;
}

function statusBadge(status) {
  return badge(String(status), status >= 200 && status < 300 ? "ok" : "bad");
}

function outcome(a) {
  if ("omitted" in a) return `${a.omitted} attempts left out`;
  return a.status !== null ? statusBadge(a.status) : badge(a.error, "bad");
}

/** One logged body: what it is, whether it was cut, and its text (JSON indented). */
function bodyView(title, body, id) {
  const notes = [body.kind, `${fmtNum(body.size)} bytes`];
  if (body.truncated) notes.push("truncated at the entry's max_bytes");
  if (body.stream_events !== undefined) notes.push(`rebuilt from ${body.stream_events} stream events`);
  const text = body.body === null ? null : typeof body.body === "string" ? body.body : JSON.stringify(body.body, null, 2);
  return h(
    "div",
    { class: "logged-body", id },
    h("h4", {}, `${title} · ${notes.join(" · ")}`),
    text === null ? h("p", { class: "muted" }, body.kind === "withheld"
      ? "Not stored: it could not be parsed, so its JSON paths could not be redacted."
      : "No body kept.") : h("pre", {}, text),
  );
}

/** The bodies member of a request: absent without bodies:read, null when none were logged. */
function bodiesView(doc) {
  if (!("bodies" in doc)) return h("p", { class: "muted", id: "bodies" }, "Logged bodies are shown to keys holding bodies:read.");
  const b = doc.bodies;
  if (b === null) return h("p", { class: "muted", id: "bodies" }, "No bodies were logged for this request.");
  return h(
    "div",
    { id: "bodies" },
    h("p", { class: "muted" }, `Logged by ${b.rule} · ${b.redactions} redaction${b.redactions === 1 ? "" : "s"} · kept until ${fmtTime(b.expires_at)}`),
    bodyView("Request", b.request, "body-request"),
    bodyView("Response", b.response, "body-response"),
  );
}

/** One request: its answer, usage, rule, the route trace as a table, and its bodies when logged. */
export function traceView(doc) {
  const facts = [
    ["Request", doc.client_request_id ? `${doc.request_id} (client id ${doc.client_request_id})` : doc.request_id],
    ["Ended", fmtTime(doc.ts)],
    ["Caller", `${doc.principal ?? doc.principal_id} · key ${doc.key_id}`],
    ["Model", doc.model],
    ["Rule", doc.rule ?? DASH],
    ["Answer", `${doc.status} from ${doc.backend ?? "no backend"} after ${doc.tries} ${doc.tries === 1 ? "try" : "tries"}`],
    ["Latency", `${ms(doc.latency_ms)} · first byte ${ms(doc.ttfb_ms)}`],
    ["Tokens", `${fmtNum(doc.prompt_tokens)} prompt + ${fmtNum(doc.completion_tokens)} completion (${doc.usage_source})`],
  ];
  if (doc.trace_id) facts.push(["Trace id", h("code", {}, doc.trace_id)]);
  return h(
    "div",
    { class: "request-detail", id: "request-detail", "data-request": doc.id },
    h("dl", { class: "facts" }, facts.flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v)])),
    h("h3", {}, "Route trace"),
    table(
      [
        ["#", (a) => String(doc.attempts.indexOf(a) + 1), "num"],
        ["Backend", (a) => a.backend ?? DASH],
        ["Provider model", (a) => a.provider_model ?? DASH],
        ["Outcome", outcome],
        ["Headers after", (a) => ms(a.ttfb_ms), "num"],
        ["Duration", (a) => ms(a.duration_ms), "num"],
        ["Next tried because", (a) => a.next_because ?? DASH],
      ],
      doc.attempts,
      "No route trace recorded for this request.",
      { id: "route-trace" },
    ),
    h("h3", {}, "Bodies"),
    bodiesView(doc),
  );
}

export async function render(main, ctx) {
  const lookup = h("input", { name: "id", id: "request-id", placeholder: "x-request-id", size: 40 });
  const only = h("select", { name: "only", id: "requests-only" },
    [["", "all"], ["error", "errors"], ["failover", "failovers"]].map(([v, t]) => h("option", { value: v }, t)));
  const detail = h("div", { id: "request-detail-box" });
  const live = h("div");
  const recent = h("div");
  const status = h("p", { class: "muted" });
  const show = async (id) => {
    lookup.value = id;
    // The id is the rest of the path ("/" and all); "." is encoded too, or "." and ".." would be taken
    // as dot-segments and resolved away before the request is sent.
    const doc = await ctx.api("GET", `/admin/requests/${encodeURIComponent(id).replaceAll(".", "%2E")}`);
    clear(detail).append(section("Request", traceView(doc)));
  };
  const form = h("form", { class: "toolbar", id: "request-lookup" }, field("Request id", lookup),
    h("button", { type: "submit" }, "Show"), field("Finished", only));
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    if (lookup.value.trim()) ctx.guard(() => show(lookup.value.trim()), detail);
  });
  main.append(h("h1", {}, "Requests"), form, status, detail, section("In flight", live), section("Finished", recent));
  const refresh = async () => {
    const q = only.value === "error" ? "&status=error" : only.value === "failover" ? "&failover=1" : "";
    const data = await ctx.api("GET", `/admin/requests?limit=100${q}`);
    clear(live).append(
      table(
        [
          ["Request", (r) => h("code", {}, r.id)],
          ["Caller", (r) => r.principal ?? r.principal_id],
          ["Model", (r) => r.model],
          ["Backend", (r) => r.backend ?? DASH],
          ["Tries", (r) => String(r.tries), "num"],
          ["Running", (r) => `${r.running_s.toFixed(1)} s`, "num"],
          ["Worker", (r) => `${r.worker} (pid ${r.pid})`],
        ],
        data.live,
        "No request in flight.",
        { id: "live-requests" },
      ),
    );
    clear(recent).append(
      table(
        [
          ["Ended", (r) => fmtTime(r.ts)],
          ["Request", (r) => h("a", { href: "#/requests", "data-id": r.id, onclick: (ev) => {
            ev.preventDefault();
            ctx.guard(() => show(r.id), detail);
          } }, r.id)],
          ["Caller", (r) => r.principal ?? r.principal_id],
          ["Model", (r) => r.model],
          ["Status", (r) => statusBadge(r.status)],
          ["Backend", (r) => r.backend ?? DASH],
          ["Tries", (r) => String(r.tries), "num"],
          ["Rule", (r) => r.rule ?? DASH],
          ["Latency", (r) => ms(r.latency_ms), "num"],
        ],
        data.recent,
        "No finished request yet.",
        { id: "recent-requests" },
      ),
    );
    status.textContent = `last ${data.recorder_size} finished requests kept · updated ${fmtTime(Date.now() / 1000)} · refreshes every ${REFRESH_MS / 1000} s`;
  };
  only.addEventListener("change", () => ctx.guard(refresh, recent));
  await refresh();
  ctx.every(REFRESH_MS, refresh, main);
  const wanted = new URLSearchParams(location.hash.split("?")[1] || "").get("id");
  if (wanted) await show(wanted);
}
