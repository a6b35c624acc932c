// Sign-in: an admin API key opens a session (an HttpOnly cookie the page never sees).

import { errorBox, field, h } from "./dom.js";

export function render(main, { api, onSignedIn, message }) {
  const key = h("input", {
    type: "password",
    name: "key",
    id: "key",
    autocomplete: "off",
    required: true,
    placeholder: "sk-gw-…",
  });
  const status = h("div", { class: "status" }, message ? h("p", { class: "muted" }, message) : null);
  const form = h(
    "form",
    { class: "login", id: "login-form" },
    h("h1", {}, "Sign in"),
    h("p", { class: "muted" }, "Use an API key whose principal holds an admin permission."),
    field("Admin API key", key),
    h("button", { type: "submit", class: "primary" }, "Sign in"),
    status,
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    status.replaceChildren();
    try {
      const session = await api("POST", "/admin/login", { key: key.value.trim() });
      key.value = "";
      onSignedIn(session);
    } catch (err) {
      status.append(errorBox(err.message));
    }
  });
  main.append(form);
  key.focus();
}
