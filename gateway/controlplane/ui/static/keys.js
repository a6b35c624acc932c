// Keys and principals: create a key (its secret shown once, with its own limits and budget), revoke one;
// keys and principals with their limits and every budget window with its spend, and (with config:write)
// an editor for principals. Forms and buttons appear only for the permissions the session holds; the API
// checks them again.

import { DASH, badge, clear, errorBox, field, fmtLimits, fmtNum, fmtTime, h, ownerText, section, table } from "./dom.js";

const LIMIT_FIELDS = [
  ["requests_per_minute", "Requests / minute"],
  ["tokens_per_minute", "Tokens / minute"],
  ["concurrent_requests", "Concurrent requests"],
];

// Where a key was made, in words: the store says file, cli or api (the admin API, this UI included).
const MADE_BY = { file: "config file", cli: "gateway keys create", api: "admin API / UI" };

function statusBadge(status) {
  return badge(status, status === "active" ? "ok" : "neutral");
}

function numberInput(name) {
  return h("input", { type: "number", min: 1, step: 1, name, inputmode: "numeric" });
}

/** The filled-in limit inputs as a limits object, or null. */
function limitsOf(inputs) {
  const out = {};
  for (const [name] of LIMIT_FIELDS) {
    if (inputs[name].value !== "") out[name] = Number(inputs[name].value);
  }
  return Object.keys(out).length ? out : null;
}

function secretBox(created, onDismiss) {
  const code = h("code", { id: "new-secret" }, created.secret);
  const copy = h("button", { type: "button" }, "Copy");
  copy.addEventListener("click", async () => {
    try {
      await navigator.clipboard.writeText(created.secret);
      copy.textContent = "Copied";
    } catch {
      copy.textContent = "Select and copy it by hand";
    }
  });
  return h(
    "div",
    { class: "secret", role: "status" },
    h("p", {}, h("strong", {}, `Key ${created.name || created.id} for ${created.principal} created.`),
      " Its secret is shown only this once: copy it now."),
    h("p", {}, code, " ", copy),
    h("button", { type: "button", class: "link", onclick: onDismiss }, "I have copied it"),
  );
}

function createKeyForm(ctx, principalNames, onCreated) {
  const principal = principalNames.length
    ? h("select", { name: "principal", required: true }, principalNames.map((n) => h("option", { value: n }, n)))
    : h("input", { name: "principal", required: true });
  const name = h("input", { name: "name", placeholder: "optional" });
  const expires = h("input", { type: "datetime-local", name: "expires" });
  const limits = Object.fromEntries(LIMIT_FIELDS.map(([n]) => [n, numberInput(n)]));
  const budget = budgetInputs("key-budget-periods");
  const status = h("div");
  const form = h(
    "form",
    { id: "create-key", class: "grid-form" },
    budget.list,
    field("Principal", principal),
    field("Name", name),
    field("Expires", expires, "local time; empty: never"),
    LIMIT_FIELDS.map(([n, label]) => field(label, limits[n], "empty: no limit")),
    field("Budget period", budget.period, "the key's own, on top of its principal's; empty: none"),
    field("Budget tokens", budget.tokens),
    field("Budget cost", budget.cost),
    h("div", { class: "actions" }, h("button", { type: "submit", class: "primary write" }, "Create key")),
    status,
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    status.replaceChildren();
    const body = { principal: principal.value };
    if (name.value.trim()) body.name = name.value.trim();
    if (expires.value) body.expires_at = Math.floor(new Date(expires.value).getTime() / 1000);
    const l = limitsOf(limits);
    if (l) body.limits = l;
    const b = budget.value();
    if (b) body.budgets = [b];
    try {
      const created = await ctx.api("POST", "/admin/keys", body);
      form.reset();
      onCreated(created);
    } catch (err) {
      status.append(errorBox(err.message));
    }
  });
  return form;
}

/** A budget's three inputs (period, tokens, cost) and its period suggestions; ``value()`` is the budget
 * they describe, or null when all are empty. */
function budgetInputs(listId) {
  const period = h("input", { name: "period", list: listId, placeholder: "month" });
  const tokens = numberInput("budget_tokens");
  const cost = h("input", { type: "number", min: 0, step: "any", name: "budget_cost" });
  const list = h("datalist", { id: listId }, ["day", "month", "7d", "1h"].map((p) => h("option", { value: p })));
  const value = () => {
    if (!period.value.trim() && !tokens.value && !cost.value) return null;
    const out = { period: period.value.trim() || "month" };
    if (tokens.value) out.tokens = Number(tokens.value);
    if (cost.value) out.cost = Number(cost.value);
    return out;
  };
  return { period, tokens, cost, list, value };
}

function principalEditor(ctx, roles, onSaved) {
  const name = h("input", { name: "name", required: true });
  const roleBoxes = roles.map((r) => h("input", { type: "checkbox", name: "role", value: r.name }));
  const limits = Object.fromEntries(LIMIT_FIELDS.map(([n]) => [n, numberInput(n)]));
  const budget = budgetInputs("budget-periods");
  const { period, tokens, cost } = budget;
  const status = h("div");
  const form = h(
    "form",
    { id: "principal-editor", class: "grid-form" },
    budget.list,
    field("Name", name, "an existing name edits that principal"),
    h(
      "fieldset",
      { class: "roles" },
      h("legend", {}, "Roles"),
      roles.length ? roleBoxes.map((box, i) => h("label", {}, box, roles[i].name)) : h("span", { class: "muted" }, "no roles"),
    ),
    LIMIT_FIELDS.map(([n, label]) => field(label, limits[n], "empty: no limit")),
    field("Budget period", period, "its first budget: day, month or a window like 7d; empty: none. Others are kept"),
    field("Budget tokens", tokens),
    field("Budget cost", cost),
    h("div", { class: "actions" }, h("button", { type: "submit", class: "primary write" }, "Save principal")),
    status,
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    status.replaceChildren();
    const path = `/admin/principals/${encodeURIComponent(name.value.trim())}`;
    try {
      // Start from the entry as configured, so fields this form does not edit (model_limits) are kept.
      let entry = {};
      try {
        entry = await ctx.api("GET", path);
      } catch (err) {
        if (err.status !== 404) throw err;
      }
      entry.roles = roleBoxes.filter((b) => b.checked).map((b) => b.value);
      const l = limitsOf(limits);
      if (l) entry.limits = l;
      else delete entry.limits;
      // The form edits the first budget (keeping its alert thresholds); any others stay as they are.
      const had = entry.budgets || (entry.budget ? [entry.budget] : []);
      delete entry.budget;
      const first = budget.value();
      if (first && had[0] && had[0].alerts) first.alerts = had[0].alerts;
      const budgets = first ? [first, ...had.slice(1)] : had.slice(1);
      if (budgets.length) entry.budgets = budgets;
      else delete entry.budgets;
      await ctx.api("PUT", path, entry);
      status.append(h("p", { class: "ok-note" }, `Principal ${name.value.trim()} saved.`));
      onSaved();
    } catch (err) {
      status.append(errorBox(err.message));
    }
  });
  const load = (p) => {
    name.value = p.name;
    for (const box of roleBoxes) box.checked = (p.roles || []).includes(box.value);
    for (const [n] of LIMIT_FIELDS) limits[n].value = (p.limits && p.limits[n]) ?? "";
    period.value = (p.budget && p.budget.period) || "";
    tokens.value = (p.budget && p.budget.tokens) ?? "";
    cost.value = (p.budget && p.budget.cost) ?? "";
    name.focus();
  };
  return { form, load };
}

/** Every budget of a principal or key, one a line, each with what its current window has spent.
 * ``spendOf(period)`` finds that window in GET /admin/budgets. */
function budgetText(budgets, spendOf) {
  if (!budgets || !budgets.length) return DASH;
  return budgets.flatMap((b, i) => {
    const caps = [b.tokens ? `${fmtNum(b.tokens)} tokens` : null, b.cost ? `${fmtNum(b.cost)} cost` : null];
    const out = i ? [h("br")] : [];
    out.push(`${caps.filter(Boolean).join(" · ")} per ${b.period}`);
    const spend = spendOf(b.period);
    if (spend) {
      const used = [b.tokens ? `${fmtNum(spend.tokens)} tokens` : null, b.cost ? `${fmtNum(spend.cost)} cost` : null];
      out.push(h("br"), h("small", { class: spend.exceeded ? "bad-text" : "muted" }, `spent ${used.filter(Boolean).join(" · ")}${spend.exceeded ? " (exceeded)" : ""}`));
    }
    return out;
  });
}

export async function render(main, ctx) {
  main.append(h("h1", {}, "Keys & principals"));
  const secretSlot = h("div", { id: "secret-slot" });
  const keysSlot = h("div");
  const principalsSlot = h("div");
  main.append(secretSlot);

  const readable = ctx.can("config:read");
  let principals = [];
  let roles = [];
  if (readable) {
    [principals, roles] = await Promise.all([ctx.api("GET", "/admin/principals"), ctx.api("GET", "/admin/roles")]);
  }

  const refresh = async () => {
    if (!readable) return;
    const [keys, people, budgets] = await Promise.all([
      ctx.api("GET", "/admin/keys"),
      ctx.api("GET", "/admin/principals"),
      ctx.can("usage:read") ? ctx.api("GET", "/admin/budgets") : Promise.resolve([]),
    ]);
    // Each window's spend, by whose budget it is: "principal|period" or "principal|key|period".
    const spend = new Map(budgets.map((b) => [[b.principal, ...(b.key === null ? [] : [b.key]), b.period].join("|"), b]));
    clear(keysSlot).append(
      table(
        [
          ["Name", (k) => k.name],
          ["ID", (k) => h("code", {}, k.id)],
          ["Principal", (k) => k.principal],
          ["Status", (k) => statusBadge(k.status)],
          ["Created", (k) => fmtTime(k.created_at)],
          ["Expires", (k) => (k.expires_at ? fmtTime(k.expires_at) : "never")],
          ["Limits", (k) => fmtLimits(k.limits)],
          ["Budgets", (k) => budgetText(k.budgets, (period) => spend.get([k.principal, k.name || k.id, period].join("|")))],
          ["Managed by", (k) => MADE_BY[k.managed_by] || k.managed_by],
          [
            "",
            (k) =>
              ctx.can("key:revoke") && k.status === "active"
                ? h("button", { type: "button", class: "danger write revoke", "data-key": k.id, onclick: () => revoke(k) }, "Revoke")
                : [], // an empty cell, not a dash
          ],
        ],
        keys,
        "No keys.",
        { id: "keys" },
      ),
    );
    clear(principalsSlot).append(
      table(
        [
          ["Name", (p) => p.name],
          ["Roles", (p) => (p.roles || []).join(", ")],
          ["Active keys", (p) => fmtNum(p.active_keys), "num"],
          ["Limits", (p) => fmtLimits(p.limits)],
          [
            "Model limits",
            (p) => Object.entries(p.model_limits || {}).map(([m, l]) => `${m}: ${fmtLimits(l)}`).join("; "),
          ],
          ["Budget", (p) => budgetText(p.budgets, (period) => spend.get([p.name, period].join("|")))],
          ["Owner", (p) => ownerText(p.owner)],
          [
            "",
            (p) =>
              // A principal a config file owns is read-only here (the API would answer 409).
              editor && (!p.owner || p.owner === "store")
                ? h("button", { type: "button", class: "write edit", onclick: () => editor.load(p) }, "Edit")
                : [],
          ],
        ],
        people,
        "No principals.",
        { id: "principals" },
      ),
    );
  };

  const revoke = async (k) => {
    if (!window.confirm(`Revoke key ${k.name || k.id} of ${k.principal}? Requests with it will be refused.`)) return;
    await ctx.guard(async () => {
      await ctx.api("DELETE", `/admin/keys/${encodeURIComponent(k.id)}`);
      await refresh();
    });
  };

  const editor = ctx.can("config:write") ? principalEditor(ctx, roles, () => ctx.guard(refresh)) : null;

  if (ctx.can("key:create")) {
    const names = principals.map((p) => p.name);
    main.append(
      section(
        "Create a key",
        createKeyForm(ctx, names, (created) => {
          clear(secretSlot).append(secretBox(created, () => clear(secretSlot)));
          secretSlot.scrollIntoView({ block: "nearest" });
          ctx.guard(refresh);
        }),
      ),
    );
  }
  if (readable) {
    main.append(section("Keys", keysSlot), section("Principals", principalsSlot));
  } else {
    main.append(h("p", { class: "muted" }, "Listing keys and principals needs config:read."));
  }
  if (editor) main.append(section("Add or edit a principal", editor.form));
  await refresh();
}
