// DOM from data. Every string becomes a text node or an attribute value: nothing is ever parsed as HTML,
// so a name like "<img src=x onerror=...>" shows as those characters.

const SVG_NS = "http://www.w3.org/2000/svg";

function setAttrs(el, attrs) {
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name.startsWith("on") && typeof value === "function") {
      el.addEventListener(name.slice(2), value);
    } else {
      el.setAttribute(name, value === true ? "" : String(value));
    }
  }
}

function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : String(child));
  }
}

/** An HTML element: h("td", {class: "num"}, "42"). */
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  setAttrs(el, attrs);
  append(el, children);
  return el;
}

/** An SVG element, same calling convention. */
export function svg(tag, attrs, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  setAttrs(el, attrs);
  append(el, children);
  return el;
}

export function clear(el) {
  el.replaceChildren();
  return el;
}

export const DASH = "—";

/**
 * A table: columns are [label, (row) => cell content, optional class]; an empty list shows `empty`.
 * A cell of null, undefined or "" shows a dash; [] leaves it empty.
 */
export function table(columns, rows, empty = "Nothing yet.", attrs = {}) {
  if (!rows.length) return h("p", { ...attrs, class: "muted empty" }, empty);
  return h(
    "table",
    attrs,
    h("thead", {}, h("tr", {}, columns.map(([label, , cls]) => h("th", { class: cls }, label)))),
    h(
      "tbody",
      {},
      rows.map((row) => h("tr", {}, columns.map(([, cell, cls]) => h("td", { class: cls }, show(cell(row)))))),
    ),
  );
}

function show(value) {
  return value === null || value === undefined || value === "" ? DASH : value;
}

export function section(title, ...children) {
  return h("section", {}, h("h2", {}, title), ...children);
}

export function badge(text, kind) {
  return h("span", { class: `badge ${kind}` }, text);
}

export function errorBox(message) {
  return h("p", { class: "error", role: "alert" }, message);
}

function pad(n) {
  return String(n).padStart(2, "0");
}

/** Unix seconds as local "YYYY-MM-DD HH:MM:SS". */
export function fmtTime(ts) {
  if (ts === null || ts === undefined) return DASH;
  const d = new Date(ts * 1000);
  return (
    `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ` +
    `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`
  );
}

export function fmtNum(n) {
  if (n === null || n === undefined) return DASH;
  return Number(n).toLocaleString("en-US", { maximumFractionDigits: 6 });
}

/** 1234 -> "1.2k", for axes. */
export function fmtCompact(n) {
  const abs = Math.abs(n);
  for (const [size, unit] of [[1e9, "G"], [1e6, "M"], [1e3, "k"]]) {
    if (abs >= size) return `${+(n / size).toFixed(1)}${unit}`;
  }
  return String(+n.toFixed(2));
}

export function fmtDuration(seconds) {
  if (seconds === null || seconds === undefined) return DASH;
  const s = Math.round(seconds);
  if (s < 120) return `${s} s`;
  if (s < 7200) return `${Math.round(s / 60)} min`;
  if (s < 172800) return `${Math.round(s / 3600)} h`;
  return `${Math.round(s / 86400)} d`;
}

/** {requests_per_minute: 10, concurrent_requests: 2} -> "rpm 10 · concurrency 2". */
export function fmtLimits(limits) {
  if (!limits) return DASH;
  const short = { requests_per_minute: "rpm", tokens_per_minute: "tpm", concurrent_requests: "concurrency" };
  const parts = Object.entries(limits).map(([k, v]) => `${short[k] || k} ${fmtNum(v)}`);
  return parts.length ? parts.join(" · ") : DASH;
}

export function compactJson(value) {
  return value === null || value === undefined ? DASH : JSON.stringify(value);
}

/** A labelled form field. */
export function field(label, control, hint) {
  return h("label", { class: "field" }, h("span", {}, label), control, hint ? h("small", {}, hint) : null);
}

// Who owns a configuration entry: a config file (read-only in the UI and the API: edit the file and
// reload it) or the store (made through the API or this UI).
export function ownerText(owner) {
  if (!owner || owner === "store") return "store (API / UI)";
  return h("span", { class: "owner-file", title: "read-only here: edit the file and reload it" }, `file ${owner.slice(5)} (read-only)`);
}
