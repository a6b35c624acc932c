// The admin UI's shell: who is signed in, the nav bar, and which page the location's hash names.
// Pages are modules with render(main, ctx); a page the session's permissions do not cover is neither
// linked nor rendered (and the API would refuse its calls anyway).

import { ApiError, api, apiOptional, setCsrfToken } from "./api.js";
import * as audit from "./audit.js";
import { clear, errorBox, h } from "./dom.js";
import * as fleet from "./fleet.js";
import * as keys from "./keys.js";
import * as login from "./login.js";
import * as models from "./models.js";
import * as requests from "./requests.js";
import * as usage from "./usage.js";

// needs: any one of these permissions opens the page.
const PAGES = [
  { id: "fleet", title: "Fleet", page: fleet, needs: ["config:read"] },
  { id: "models", title: "Models", page: models, needs: ["config:read"] },
  { id: "keys", title: "Keys & principals", page: keys, needs: ["config:read", "key:create", "key:revoke"] },
  { id: "usage", title: "Usage", page: usage, needs: ["usage:read"] },
  { id: "requests", title: "Requests", page: requests, needs: ["usage:read"] },
  { id: "audit", title: "Audit log", page: audit, needs: ["config:read"] },
];

const nav = document.getElementById("nav");
const who = document.getElementById("who");
const main = document.getElementById("main");

let me = null; // {principal, permissions, csrf_token}
let timers = [];

function can(permission) {
  if (!me) return false;
  const held = me.permissions;
  return held.includes(permission) || (permission === "config:read" && held.includes("config:write"));
}

function opens(page) {
  return page.needs.some(can);
}

function stopTimers() {
  timers.forEach(clearInterval);
  timers = [];
}

function signedIn(session) {
  me = session;
  setCsrfToken(session.csrf_token);
  clear(nav).append(
    ...PAGES.filter(opens).map((p) => h("a", { href: `#/${p.id}`, "data-page": p.id }, p.title)),
  );
  clear(who).append(
    h("span", { class: "principal", title: "signed in as" }, session.principal),
    h("button", { type: "button", class: "link", id: "sign-out", onclick: signOut }, "Sign out"),
  );
  route();
}

function signedOut(message) {
  me = null;
  stopTimers();
  setCsrfToken(null);
  clear(nav);
  clear(who);
  login.render(clear(main), { api, onSignedIn: signedIn, message });
}

async function signOut() {
  try {
    await api("POST", "/admin/logout");
  } finally {
    history.replaceState(null, "", "#/");
    signedOut("Signed out.");
  }
}

/** What pages get: the API, permission checks, timers that stop when the page is left, error display. */
function context() {
  return {
    api,
    apiOptional,
    can,
    every(ms, fn, where) {
      timers.push(setInterval(() => guard(fn, where), ms));
    },
    guard,
  };
}

/** Run a page's async work; a lost session sends the user to sign in again, other errors show. */
async function guard(fn, where = main) {
  try {
    return await fn();
  } catch (err) {
    if (err instanceof ApiError && err.status === 401) {
      signedOut(`Signed out: ${err.message}`);
    } else if (where.isConnected) {
      const shown = where.firstElementChild;
      if (shown && shown.classList.contains("error")) shown.remove();
      where.prepend(errorBox(err.message));
    }
    return undefined;
  }
}

function route() {
  stopTimers();
  if (!me) return;
  const id = location.hash.replace(/^#\/?/, "").split("?")[0];
  const allowed = PAGES.filter(opens);
  const page = PAGES.find((p) => p.id === id);
  if (!page) {
    if (allowed.length) {
      location.replace(`#/${allowed[0].id}`);
    } else {
      clear(main).append(h("h1", {}, "Nothing to show"), h("p", {}, "This session holds no permission a page needs."));
    }
    return;
  }
  for (const link of nav.querySelectorAll("a")) {
    link.classList.toggle("active", link.dataset.page === page.id);
  }
  document.title = `${page.title} · gateway admin`;
  clear(main);
  if (!opens(page)) {
    main.append(
      h("h1", {}, page.title),
      h(
        "p",
        { class: "denied" },
        `You do not have permission to see this page: it needs ${page.needs.join(" or ")}.`,
      ),
    );
    return;
  }
  const ctx = context();
  guard(() => page.page.render(main, ctx));
}

async function start() {
  window.addEventListener("hashchange", route);
  try {
    signedIn(await api("GET", "/admin/whoami"));
  } catch (err) {
    if (err instanceof ApiError && (err.status === 401 || err.status === 403)) {
      signedOut(err.status === 403 ? err.message : null);
    } else {
      clear(main).append(errorBox(err.message));
    }
  }
}

start();
