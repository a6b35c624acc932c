// Usage: tokens and requests over time per principal, model, key or backend, as SVG charts, with the
// totals, every budget window of principals and keys, and a CSV export of the same query
// (GET /admin/usage?format=csv).

import { colours, lineChart, stackedBarChart } from "./chart.js";
import { DASH, badge, clear, field, fmtNum, fmtTime, h, section, table } from "./dom.js";

// What the range selector offers: how far back, and the bucket size the API is asked for.
const RANGES = {
  "1h": { label: "Last hour", bucket: "minute", step: 60 },
  "6h": { label: "Last 6 hours", bucket: "minute", step: 60 },
  "24h": { label: "Last 24 hours", bucket: "hour", step: 3600 },
  "7d": { label: "Last 7 days", bucket: "hour", step: 3600 },
  "30d": { label: "Last 30 days", bucket: "day", step: 86400 },
};
const GROUPINGS = ["principal", "model", "key", "backend", "tag"];
const MAX_SERIES = 8; // the rest are added up as "other"

function pad(n) {
  return String(n).padStart(2, "0");
}

function xFormatter(step) {
  return (ts) => {
    const d = new Date(ts * 1000);
    if (step >= 86400) return `${pad(d.getMonth() + 1)}-${pad(d.getDate())}`;
    return `${pad(d.getHours())}:${pad(d.getMinutes())}`;
  };
}

/**
 * The API's groups (one per group and bucket) as aligned series over every bucket of the range, in the
 * order `names` gives (the totals table's), past MAX_SERIES added up as "other": so the tokens chart and
 * the requests chart show the same series in the same order, each in its one colour from `palette`.
 */
function seriesOf(data, step, metric, names, palette) {
  const first = Math.floor(data.since / step) * step;
  const last = Math.floor((data.until - 1) / step) * step;
  const xs = [];
  for (let t = first; t <= last; t += step) xs.push(t);
  const index = new Map(xs.map((t, i) => [t, i]));
  const byGroup = new Map();
  for (const g of data.groups) {
    if (!byGroup.has(g.group)) byGroup.set(g.group, new Array(xs.length).fill(0));
    const i = index.get(g.bucket_start);
    if (i !== undefined) byGroup.get(g.group)[i] += g[metric];
  }
  let series = names.map((name) => ({
    name,
    values: byGroup.get(name) || new Array(xs.length).fill(0),
    colour: palette.get(name),
  }));
  if (series.length > MAX_SERIES) {
    const rest = series.slice(MAX_SERIES - 1);
    const other = xs.map((_, i) => rest.reduce((sum, s) => sum + s.values[i], 0));
    const name = `other (${rest.length})`;
    series = [...series.slice(0, MAX_SERIES - 1), { name, values: other, colour: palette.get(name) }];
  }
  return { xs, series };
}

function totals(groups) {
  const out = new Map();
  for (const g of groups) {
    const t = out.get(g.group) || { group: g.group, requests: 0, errors: 0, prompt_tokens: 0, completion_tokens: 0, total_tokens: 0, cost: 0 };
    for (const k of ["requests", "errors", "prompt_tokens", "completion_tokens", "total_tokens", "cost"]) t[k] += g[k];
    out.set(g.group, t);
  }
  return [...out.values()].sort((a, b) => b.total_tokens - a.total_tokens || a.group.localeCompare(b.group));
}

export async function render(main, ctx) {
  const range = h("select", { name: "range", id: "usage-range" }, Object.entries(RANGES).map(([v, r]) => h("option", { value: v }, r.label)));
  const by = h("select", { name: "by", id: "usage-by" }, GROUPINGS.map((g) => h("option", { value: g }, g)));
  const csv = h("a", { class: "button", id: "usage-csv", download: "" }, "Export CSV");
  const reload = h("button", { type: "button", id: "usage-refresh" }, "Refresh");
  const body = h("div", { id: "usage" });
  const budgets = h("div");
  main.append(
    h("h1", {}, "Usage"),
    h("form", { class: "toolbar", id: "usage-controls" }, field("Range", range), field("Group by", by), reload, csv),
    body,
    section("Budgets", budgets),
  );

  const load = async () => {
    const r = RANGES[range.value];
    const query = new URLSearchParams({ since: range.value, by: by.value, bucket: r.bucket });
    csv.setAttribute("href", `/admin/usage?${query}&format=csv`);
    const [data, spend] = await Promise.all([ctx.api("GET", `/admin/usage?${query}`), ctx.api("GET", "/admin/budgets")]);
    const fmt = xFormatter(r.step);
    const rows = totals(data.groups);
    const names = rows.map((t) => t.group);
    const shown = names.length > MAX_SERIES ? [...names.slice(0, MAX_SERIES - 1), `other (${names.length - MAX_SERIES + 1})`] : names;
    const palette = colours(shown);
    const tokens = seriesOf(data, r.step, "total_tokens", names, palette);
    const requests = seriesOf(data, r.step, "requests", names, palette);
    clear(body).append(
      h("p", { class: "muted" }, `${fmtTime(data.since)} to ${fmtTime(data.until)}, per ${r.bucket}, by ${data.by}.`),
      rows.length
        ? h(
            "div",
            { class: "charts" },
            lineChart(`Tokens per ${r.bucket}, by ${data.by}`, tokens.xs, tokens.series, fmt),
            stackedBarChart(`Requests per ${r.bucket}, by ${data.by}`, requests.xs, requests.series, fmt),
          )
        : null,
      section(
        "Totals",
        table(
          [
            [data.by[0].toUpperCase() + data.by.slice(1), (t) => t.group],
            ["Requests", (t) => fmtNum(t.requests), "num"],
            ["Errors", (t) => fmtNum(t.errors), "num"],
            ["Prompt tokens", (t) => fmtNum(t.prompt_tokens), "num"],
            ["Completion tokens", (t) => fmtNum(t.completion_tokens), "num"],
            ["Total tokens", (t) => fmtNum(t.total_tokens), "num"],
            ["Cost", (t) => fmtNum(Math.round(t.cost * 1e6) / 1e6), "num"],
          ],
          rows,
          "No usage in this range.",
          { id: "usage-totals" },
        ),
      ),
    );
    clear(budgets).append(
      table(
        [
          ["Principal", (b) => b.principal],
          ["Key", (b) => (b.key === null ? DASH : b.key)],
          ["Period", (b) => `${b.period} (until ${fmtTime(b.window_end)})`],
          ["Tokens", (b) => `${fmtNum(b.tokens)} / ${b.tokens_limit === null ? DASH : fmtNum(b.tokens_limit)}`, "num"],
          ["Cost", (b) => `${fmtNum(b.cost)} / ${b.cost_limit === null ? DASH : fmtNum(b.cost_limit)}`, "num"],
          ["", (b) => (b.exceeded ? badge("exceeded", "bad") : badge("within", "ok"))],
        ],
        spend,
        "No principal or key has a budget.",
        { id: "budgets" },
      ),
    );
  };
  range.addEventListener("change", () => ctx.guard(load, body));
  by.addEventListener("change", () => ctx.guard(load, body));
  reload.addEventListener("click", () => ctx.guard(load, body));
  await load();
}
