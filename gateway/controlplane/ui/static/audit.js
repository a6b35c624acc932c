// Audit log: every configuration and key write, newest first, with the state before and after.

import { DASH, clear, field, fmtTime, h, table } from "./dom.js";

function change(entry) {
  if (entry.before === null && entry.after === null) return DASH;
  return h(
    "details",
    {},
    h("summary", {}, "before / after"),
    h("div", { class: "diff" },
      h("div", {}, h("h4", {}, "Before"), h("pre", {}, entry.before ?? DASH)),
      h("div", {}, h("h4", {}, "After"), h("pre", {}, entry.after ?? DASH))),
  );
}

export async function render(main, ctx) {
  const limit = h("select", { name: "limit", id: "audit-limit" }, ["50", "100", "500", "1000"].map((n) => h("option", { value: n }, n)));
  limit.value = "100";
  const body = h("div");
  main.append(h("h1", {}, "Audit log"), h("form", { class: "toolbar" }, field("Entries", limit)), body);
  const load = async () => {
    const entries = await ctx.api("GET", `/admin/audit?limit=${limit.value}`);
    clear(body).append(
      table(
        [
          ["Time", (e) => fmtTime(e.ts)],
          ["Actor", (e) => e.actor],
          ["Action", (e) => h("code", {}, e.action)],
          ["Target", (e) => e.target],
          ["Change", change],
        ],
        entries,
        "No writes recorded yet.",
        { id: "audit" },
      ),
    );
  };
  limit.addEventListener("change", () => ctx.guard(load, body));
  await load();
}
