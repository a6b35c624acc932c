// Charts as inline SVG, drawn here: a line chart and a stacked bar chart over time buckets, with axes,
// gridlines and a legend. Colours are presentation attributes (fill, stroke), not style, so the strict
// Content-Security-Policy (no inline style) holds; every label is a text node. A series brings its own
// colour (see colours()), so that charts drawn side by side give one group one colour.

import { fmtCompact, h, svg } from "./dom.js";

export const PALETTE = ["#2563eb", "#dc2626", "#16a34a", "#d97706", "#7c3aed", "#0891b2", "#db2777", "#4b5563"];

/** One colour per name, in the order given; the same map for every chart of a page. */
export function colours(names) {
  return new Map(names.map((name, i) => [name, PALETTE[i % PALETTE.length]]));
}

const colourOf = (s, i) => s.colour || PALETTE[i % PALETTE.length];

const W = 760;
const H = 260;
const M = { left: 56, right: 16, top: 14, bottom: 30 };

/** Round steps (1, 2, 5 × 10^n) from 0 up to at least `max`. */
function ticks(max, count = 5) {
  if (!(max > 0)) return [0, 1];
  const raw = max / count;
  const mag = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= raw);
  const out = [];
  for (let v = 0; v < max + step; v += step) out.push(v);
  return out;
}

function frame(title, xs, top, formatX) {
  const yTicks = ticks(top);
  const yMax = yTicks[yTicks.length - 1];
  const plotW = W - M.left - M.right;
  const plotH = H - M.top - M.bottom;
  const y = (v) => M.top + plotH - (v / yMax) * plotH;
  const root = svg("svg", {
    viewBox: `0 0 ${W} ${H}`,
    class: "chart",
    role: "img",
    "aria-label": title,
    preserveAspectRatio: "xMidYMid meet",
  });
  root.append(svg("title", {}, title));
  for (const v of yTicks) {
    root.append(
      svg("line", { x1: M.left, x2: W - M.right, y1: y(v), y2: y(v), class: "grid" }),
      svg("text", { x: M.left - 6, y: y(v) + 4, class: "tick", "text-anchor": "end" }, fmtCompact(v)),
    );
  }
  const every = Math.max(1, Math.ceil(xs.length / 7));
  const slot = plotW / Math.max(1, xs.length);
  const x = (i) => M.left + slot * (i + 0.5);
  xs.forEach((value, i) => {
    if (i % every !== 0) return;
    root.append(
      svg("line", { x1: x(i), x2: x(i), y1: M.top + plotH, y2: M.top + plotH + 4, class: "axis" }),
      svg("text", { x: x(i), y: H - 10, class: "tick", "text-anchor": "middle" }, formatX(value)),
    );
  });
  root.append(
    svg("line", { x1: M.left, x2: M.left, y1: M.top, y2: M.top + plotH, class: "axis" }),
    svg("line", { x1: M.left, x2: W - M.right, y1: M.top + plotH, y2: M.top + plotH, class: "axis" }),
  );
  return { root, x, y, slot };
}

function legend(series) {
  return h(
    "ul",
    { class: "legend" },
    series.map((s, i) =>
      h(
        "li",
        {},
        svg("svg", { width: 12, height: 12, viewBox: "0 0 12 12", "aria-hidden": "true" },
          svg("rect", { width: 12, height: 12, rx: 2, fill: colourOf(s, i) })),
        s.name,
      ),
    ),
  );
}

function figure(title, chart, series) {
  return h("figure", { class: "chart-box" }, h("figcaption", {}, title), chart, legend(series));
}

/**
 * One line per series over the buckets `xs`: series = [{name, values: [number per x], colour?}].
 */
export function lineChart(title, xs, series, formatX) {
  const top = Math.max(0, ...series.flatMap((s) => s.values));
  const { root, x, y } = frame(title, xs, top, formatX);
  series.forEach((s, i) => {
    const colour = colourOf(s, i);
    const points = s.values.map((v, j) => `${x(j).toFixed(1)},${y(v).toFixed(1)}`).join(" ");
    root.append(svg("polyline", { points, fill: "none", stroke: colour, "stroke-width": 2, class: "series" }));
    s.values.forEach((v, j) => {
      if (v > 0) {
        root.append(
          svg("circle", { cx: x(j), cy: y(v), r: 3, fill: colour },
            svg("title", {}, `${s.name} · ${formatX(xs[j])}: ${v.toLocaleString("en-US")}`)),
        );
      }
    });
  });
  return figure(title, root, series);
}

/** Bars stacked per bucket, one segment per series. */
export function stackedBarChart(title, xs, series, formatX) {
  const totals = xs.map((_, j) => series.reduce((sum, s) => sum + s.values[j], 0));
  const { root, x, y, slot } = frame(title, xs, Math.max(0, ...totals), formatX);
  const width = Math.max(1, slot * 0.7);
  xs.forEach((_, j) => {
    let base = 0;
    series.forEach((s, i) => {
      const v = s.values[j];
      if (!(v > 0)) return;
      root.append(
        svg(
          "rect",
          {
            x: (x(j) - width / 2).toFixed(1),
            y: y(base + v).toFixed(1),
            width: width.toFixed(1),
            height: Math.max(0.5, y(base) - y(base + v)).toFixed(1),
            fill: colourOf(s, i),
            class: "series",
          },
          svg("title", {}, `${s.name} · ${formatX(xs[j])}: ${v.toLocaleString("en-US")}`),
        ),
      );
      base += v;
    });
  });
  return figure(title, root, series);
}
