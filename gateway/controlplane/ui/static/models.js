// Models: frontend models with their routing rules, provider models, backends, pools, and the dry-run
// form (paste a request, see which rule matched, where it would go, and whether a budget would refuse it).

import { DASH, compactJson, errorBox, field, fmtNum, h, ownerText, section, table } from "./dom.js";

function price(p) {
  if (!p) return DASH;
  const cached = p.cached_input !== undefined ? ` · cached ${p.cached_input}` : "";
  return `in ${p.input} · out ${p.output}${cached} /M`;
}

// A rule as the configuration writes it (route = [...], refuse = {status, message}, delegate = "model")
// or as a flattened description (action, targets, status, message, model).
function ruleAction(rule) {
  if (rule.action) return rule.action;
  if (rule.refuse) return "refuse";
  if (rule.delegate) return "delegate";
  return "route";
}

function ruleOutcome(rule) {
  const extras = [rule.tag ? `tag ${rule.tag}` : null, rule.policy ? `policy ${rule.policy}` : null];
  let outcome;
  switch (ruleAction(rule)) {
    case "refuse": {
      const r = rule.refuse || rule;
      outcome = `refuse ${r.status ?? ""}${r.message ? `: ${r.message}` : ""}`.trim();
      break;
    }
    case "delegate":
      outcome = `delegate to ${rule.delegate ?? rule.model ?? DASH}`;
      break;
    default: {
      const targets = rule.route || rule.targets || [];
      outcome = `route to ${targets.map((t) => (typeof t === "string" ? t : compactJson(t))).join(", ") || DASH}`;
    }
  }
  return [outcome, ...extras].filter(Boolean).join(" · ");
}

function rulesSection(models) {
  const withRules = models.filter((m) => Array.isArray(m.rules) && m.rules.length);
  if (!withRules.length) return null;
  return section(
    "Rules",
    withRules.map((m) =>
      h(
        "div",
        { class: "rules" },
        h("h3", {}, m.name),
        table(
          [
            ["#", (r) => r.index, "num"],
            ["Name", (r) => r.name],
            ["When", (r) => (r.when && Object.keys(r.when).length ? h("code", {}, compactJson(r.when)) : "always")],
            ["Action", (r) => ruleAction(r)],
            ["Outcome", (r) => ruleOutcome(r)],
          ],
          m.rules.map((r, index) => ({ index, ...r })),
        ),
      ),
    ),
  );
}

function pool(p) {
  const { name, policy, members, ...rest } = p;
  return { name, policy, members: (members || []).join(", "), detail: Object.keys(rest).length ? compactJson(rest) : null };
}

function dryRunResult(answer) {
  if (answer === null) return h("p", { class: "muted", id: "dry-run-result" }, "Dry run not available on this gateway.");
  const rule = answer.rule;
  const called = answer.called && answer.called !== answer.model ? `${answer.called} → ` : "";
  const parts = [
    h("p", {}, "Model: ", h("strong", {}, `${called}${answer.model ?? DASH}`)),
    h(
      "p",
      {},
      "Rule: ",
      rule ? h("strong", {}, `#${rule.index}${rule.name ? ` ${rule.name}` : ""} (${rule.action})`) : "none (the model's chain)",
    ),
  ];
  if (answer.allowed === false) {
    parts.push(h("p", { class: "refused" }, "This principal may not call this model: the gateway would answer 403."));
  }
  const notes = [answer.tag ? `tag ${answer.tag}` : null, answer.fallback ? "the deployment-wide fallback's targets" : null];
  if (notes.some(Boolean)) parts.push(h("p", { class: "muted" }, notes.filter(Boolean).join(" · ")));
  if (answer.refused) {
    parts.push(h("p", { class: "refused" }, `Refused with ${answer.refused.status}: ${answer.refused.message ?? ""}`));
  }
  if (answer.budget_refusal) {
    parts.push(h("p", { class: "refused" }, `A budget would refuse it with 402: ${answer.budget_refusal}`));
  }
  parts.push(
    table(
      [
        ["Order", (t) => t.order, "num"],
        ["Provider model", (t) => t.provider_model],
        ["Backend", (t) => t.backend],
        ["Upstream model", (t) => t.upstream_model],
      ],
      (answer.targets || []).map((t, i) => ({ order: i + 1, ...t })),
      answer.refused ? "No targets: the request is refused." : "No targets.",
    ),
  );
  return h("div", { id: "dry-run-result", class: "result" }, parts);
}

function dryRunForm(ctx, modelNames, principalNames) {
  const model = h("input", { name: "model", list: "dry-run-models", required: true, value: modelNames[0] || "" });
  const principal = h("input", { name: "principal", list: "dry-run-principals", value: principalNames[0] || "" });
  const headers = h("textarea", { name: "headers", rows: 3, spellcheck: "false" });
  headers.value = "{}";
  const body = h("textarea", { name: "body", rows: 9, spellcheck: "false" });
  body.value = JSON.stringify({ messages: [{ role: "user", content: "Hello" }], max_tokens: 64 }, null, 2);
  const out = h("div", { class: "dry-run-out" });
  const form = h(
    "form",
    { id: "dry-run", class: "grid-form" },
    h("datalist", { id: "dry-run-models" }, modelNames.map((n) => h("option", { value: n }))),
    h("datalist", { id: "dry-run-principals" }, principalNames.map((n) => h("option", { value: n }))),
    field("Model", model),
    field("Principal", principal),
    field("Headers (JSON object)", headers),
    field("Body (JSON object)", body),
    h("div", { class: "actions" }, h("button", { type: "submit", class: "primary" }, "Dry run")),
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    out.replaceChildren();
    let request;
    try {
      request = {
        model: model.value.trim(),
        principal: principal.value.trim() || null,
        headers: JSON.parse(headers.value || "{}"),
        body: JSON.parse(body.value || "{}"),
      };
    } catch (err) {
      out.append(errorBox(`Not JSON: ${err.message}`));
      return;
    }
    try {
      out.append(dryRunResult(await ctx.apiOptional("POST", "/admin/routing/dry-run", request)));
    } catch (err) {
      out.append(errorBox(err.message));
    }
  });
  return [h("p", { class: "muted" }, "Paste a request: the answer names the rule that matches and the targets, in order, nothing is sent."), form, out];
}

function credential(b) {
  if (!b.api_key_fingerprint) return DASH;
  // Credentials are write-only: where it came from and a fingerprint, never the key.
  return [b.api_key_source || "inline", " ", h("code", {}, b.api_key_fingerprint)];
}

export async function render(main, ctx) {
  main.append(h("h1", {}, "Models"));
  const [models, providerModels, backends, pools, principals] = await Promise.all([
    ctx.api("GET", "/admin/models"),
    ctx.api("GET", "/admin/provider_models"),
    ctx.api("GET", "/admin/backends"),
    ctx.apiOptional("GET", "/admin/pools"),
    ctx.api("GET", "/admin/principals"),
  ]);
  main.append(
    section(
      "Frontend models",
      table(
        [
          ["Name", (m) => m.name],
          ["Aliases", (m) => (m.aliases || []).join(", ")],
          ["Chain", (m) => (m.chain || []).join(" → ")],
          ["Price", (m) => price(m.price)],
          ["Rules", (m) => fmtNum((m.rules || []).length), "num"],
          ["Owner", (m) => ownerText(m.owner)],
        ],
        models,
        "No frontend models.",
        { id: "models" },
      ),
    ),
  );
  const rules = rulesSection(models);
  if (rules) main.append(rules);
  main.append(
    section(
      "Provider models",
      table(
        [
          ["Name", (m) => m.name],
          [
            "Backends",
            (m) =>
              (m.backends || [])
                .map((b) => (typeof b === "string" ? b : `${b.backend}${b.model ? ` (${b.model})` : ""}`))
                .join(", "),
          ],
          ["Price", (m) => price(m.price)],
          ["Owner", (m) => ownerText(m.owner)],
        ],
        providerModels,
        "No provider models.",
        { id: "provider-models" },
      ),
    ),
  );
  if (pools !== null) {
    const list = Array.isArray(pools) ? pools : Object.entries(pools).map(([name, p]) => ({ name, ...p }));
    main.append(
      section(
        "Pools",
        table(
          [
            ["Name", (p) => p.name],
            ["Policy", (p) => p.policy],
            ["Members", (p) => p.members],
            ["Settings", (p) => (p.detail ? h("code", {}, p.detail) : null)],
          ],
          list.map(pool),
          "No pools.",
          { id: "pools" },
        ),
      ),
    );
  }
  main.append(
    section(
      "Backends",
      table(
        [
          ["Name", (b) => b.name],
          ["URL", (b) => b.url],
          ["Protocol", (b) => b.protocol],
          ["Timeouts (connect / first byte / read)", (b) => [b.connect_timeout, b.first_byte_timeout, b.read_timeout].map((t) => (t === undefined ? DASH : `${t} s`)).join(" / ")],
          ["Credential", credential],
          ["Owner", (b) => ownerText(b.owner)],
        ],
        backends,
        "No backends.",
        { id: "config-backends" },
      ),
    ),
    section(
      "Dry run",
      dryRunForm(
        ctx,
        models.flatMap((m) => [m.name, ...(m.aliases || [])]),
        principals.map((p) => p.name),
      ),
    ),
  );
}
