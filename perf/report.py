"""The benchmark's report: Markdown tables from a run's cells, and PNG plots (matplotlib, from the ``bench``
extra; plots are skipped with a note when it is missing). I/O: ``plot`` writes PNG files.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from perf.scenarios import FLOOR, OPTIONAL, REFERENCE

if TYPE_CHECKING:
    from perf.bench import Cell, Run

__all__ = ["PLOTS", "medians", "plot", "render_markdown"]

PLOTS = ("latency.png", "throughput.png", "streams.png", "engine-paced.png")
PACED_GROUP = "engine-paced"


def _num(value: float | None, fmt: str, suffix: str = "") -> str:
    return "—" if value is None else format(value, fmt) + suffix


def medians(cells: Sequence[Cell]) -> list[Cell]:
    """One cell per scenario and target: the median by throughput of its rounds, in first-seen order."""
    groups: dict[tuple[str, str], list[Cell]] = {}
    for c in cells:
        groups.setdefault((c.scenario, c.target), []).append(c)
    return [sorted(g, key=lambda c: c.rps)[(len(g) - 1) // 2] for g in groups.values()]


def _ratio(value: float | None, ref: float | None) -> str:
    return _num(value / ref if value is not None and ref else None, ".2f", "x")


def _paced(run: Run, scenario: str) -> bool:
    return any(s.name == scenario and s.group == PACED_GROUP for s in run.scenarios)


def _missing_rows(run: Run, scenario: str, columns: int) -> list[str]:
    """A row for each optional target that is not installed, where the scenario would have measured it."""
    s = next(s for s in run.scenarios if s.name == scenario)
    dash = " | —" * (columns - 3)
    return [
        f"| {scenario} | {t} | {why}{dash} |"
        for t, why in run.unavailable.items()
        if t in s.targets and t in run.args.targets
    ]


def requests_table(run: Run, cells: Sequence[Cell]) -> str:
    wrk_cells = [c for c in cells if c.wrk is not None]
    ref = {c.scenario: c for c in wrk_cells if c.target == REFERENCE}
    floor = {c.scenario: c for c in wrk_cells if c.target == FLOOR}
    head = (
        "| scenario | target | req/s | x nginx req/s | x minimal-proxy req/s | p50 ms | x nginx p50 | p90 ms "
        "| p99 ms | p99.9 ms | non-2xx | socket errors | CPU µs/req | peak RSS MiB |"
    )
    lines = [head, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    seen: list[str] = []
    for c in wrk_cells:
        if c.scenario not in seen and seen:
            lines += _missing_rows(run, seen[-1], 14)
        if c.scenario not in seen:
            seen.append(c.scenario)
        w = c.wrk
        assert w is not None
        r = ref.get(c.scenario)
        f = floor.get(c.scenario)
        rps_ratio = w.rps / r.rps if r and r.rps else None
        p50_ratio = w.p50_ms / r.wrk.p50_ms if r and r.wrk and r.wrk.p50_ms else None
        lines.append(
            f"| {c.scenario} | {c.target} | {w.rps:,.0f} | {_num(rps_ratio, '.2f', 'x')} "
            f"| {_ratio(w.rps, f.rps if f else None)} | {w.p50_ms:.2f} "
            f"| {_num(p50_ratio, '.2f', 'x')} | {w.p90_ms:.2f} | {w.p99_ms:.2f} | {w.p999_ms:.2f} "
            f"| {w.non_2xx} | {w.socket_errors} | {_num(c.cpu_us_per_request, '.1f')} "
            f"| {_num(c.peak_rss_mib, '.1f')} |"
        )
    if seen:
        lines += _missing_rows(run, seen[-1], 14)
    return "\n".join(lines) if seen else ""


def streams_table(run: Run, cells: Sequence[Cell]) -> str:
    head = (
        "| scenario | target | streams | complete | stalls | max open | streams/s | x nginx streams/s "
        "| x minimal-proxy streams/s | TTFB p50 ms | TTFB p99 ms | total p50 ms | total p99 ms "
        "| total p99.9 ms | CPU µs/stream | x nginx CPU | peak RSS MiB | mock engine cores |"
    )
    lines = [head, "|---|---|" + "---:|" * 16]
    ref = {c.scenario: c for c in cells if c.target == REFERENCE}
    floor = {c.scenario: c for c in cells if c.target == FLOOR}
    seen: list[str] = []
    for c in cells:
        if c.streams is None or _paced(run, c.scenario):
            continue
        if c.scenario not in seen and seen:
            lines += _missing_rows(run, seen[-1], 18)
        if c.scenario not in seen:
            seen.append(c.scenario)
        s = c.streams
        ttfb, total = s.get("ttfb_ms", {}), s.get("total_ms", {})
        burst = s.get("mode") == "burst"
        rate = "—" if burst else f"{c.rps:,.0f}"  # a burst has no steady rate
        r, f = ref.get(c.scenario), floor.get(c.scenario)
        x_ref = "—" if burst else _ratio(c.rps, r.rps if r else None)
        x_floor = "—" if burst else _ratio(c.rps, f.rps if f else None)
        lines.append(
            f"| {c.scenario} | {c.target} | {s['streams']:,} | {s['complete']:,} | {s['stalls']} "
            f"| {s['max_open']:,} | {rate} | {x_ref} | {x_floor} | {_num(ttfb.get('50.0'), '.2f')} "
            f"| {_num(ttfb.get('99.0'), '.2f')} "
            f"| {_num(total.get('50.0'), '.1f')} | {_num(total.get('99.0'), '.1f')} "
            f"| {_num(total.get('99.9'), '.1f')} | {_num(c.cpu_us_per_request, '.0f')} "
            f"| {_ratio(c.cpu_us_per_request, r.cpu_us_per_request if r else None)} "
            f"| {_num(c.peak_rss_mib, '.1f')} | {c.upstream_cpu_cores:.2f} |"
        )
    if seen:
        lines += _missing_rows(run, seen[-1], 18)
    return "\n".join(lines) if seen else ""


def paced_table(run: Run, cells: Sequence[Cell]) -> str:
    """Engine-paced streams: completion, stalls against the pacing, CPU per token and PSS per open stream
    above idle, each beside nginx's in the same scenario."""
    rows = [c for c in cells if c.streams is not None and _paced(run, c.scenario)]
    if not rows:
        return ""
    ref = {c.scenario: c for c in rows if c.target == REFERENCE}
    lines = [
        "| scenario | target | streams | complete | stalls | max open | max token gap p50 / p99 / max ms "
        "| TTFB p50 / p99 ms | CPU µs/token | x nginx | PSS idle → peak MiB | PSS KiB/stream | x nginx "
        "| upstream cores | load generator cores |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in rows:
        s = c.streams
        assert s is not None
        gap, ttfb = s.get("max_token_gap_ms", {}), s.get("ttfb_ms", {})
        r = ref.get(c.scenario)
        pss = (
            f"{c.pss_idle_mib:.1f} → {c.pss_peak_mib:.1f}"
            if c.pss_idle_mib is not None and c.pss_peak_mib is not None
            else "—"
        )
        lines.append(
            f"| {c.scenario} | {c.target} | {s['streams']:,} | {s['complete']:,} | {s['stalls']} "
            f"| {s['max_open']:,} | {_num(gap.get('50.0'), '.0f')} / {_num(gap.get('99.0'), '.0f')} / "
            f"{_num(gap.get('max'), '.0f')} "
            f"| {_num(ttfb.get('50.0'), '.1f')} / {_num(ttfb.get('99.0'), '.1f')} "
            f"| {_num(c.cpu_us_per_token, '.2f')} "
            f"| {_ratio(c.cpu_us_per_token, r.cpu_us_per_token if r else None)} | {pss} "
            f"| {_num(c.pss_per_stream_kib, '.1f')} "
            f"| {_ratio(c.pss_per_stream_kib, r.pss_per_stream_kib if r else None)} "
            f"| {c.upstream_cpu_cores:.2f} | {c.loadgen_cpu_cores:.2f} |"
        )
    return "\n".join(lines)


def peer_lines(cells: Sequence[Cell]) -> list[str]:
    """How many times the peers' throughput the gateway serves, and at what fraction of their CPU."""
    by = {(c.scenario, c.target): c for c in cells}
    out = []
    for c in cells:
        if c.target != "gateway":
            continue
        parts = []
        for peer in OPTIONAL:
            p = by.get((c.scenario, peer))
            if p is None or not p.rps:
                continue
            cpu = (
                f" at {c.cpu_us_per_request / p.cpu_us_per_request:.3f}x its CPU per request"
                if c.cpu_us_per_request and p.cpu_us_per_request
                else ""
            )
            parts.append(f"{c.rps / p.rps:,.1f}x {peer}'s ({p.rps:,.0f}/s){cpu}")
        if parts:
            out.append(f"- {c.scenario}: the full gateway ({c.rps:,.0f}/s) serves " + "; ".join(parts))
    return out


def refusing_table(run: Run, cells: Sequence[Cell]) -> str:
    """What answering 429 costs: the rate-limited key's answers against admitted requests at 64
    connections (small-c64) on the same target."""
    limited = [c for c in cells if c.scenario == "rate-limited" and c.wrk is not None]
    if not limited:
        return ""
    admitted = {c.target: c for c in cells if c.scenario == "small-c64"}
    lines = [
        "| target | answers/s | 429/s | admitted/s | p50 ms | p99 ms | CPU µs/answer "
        "| admitted req/s (small-c64) | CPU µs/req (small-c64) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in limited:
        w = c.wrk
        assert w is not None
        a = admitted.get(c.target)
        lines.append(
            f"| {c.target} | {w.rps:,.0f} | {w.rps - w.ok_rps:,.0f} | {w.ok_rps:,.1f} "
            f"| {w.p50_ms:.2f} | {w.p99_ms:.2f} | {_num(c.cpu_us_per_request, '.1f')} "
            f"| {_num(a.rps if a else None, ',.0f')} | {_num(a.cpu_us_per_request if a else None, '.1f')} |"
        )
    return "\n".join(lines)


def messages_lines(cells: Sequence[Cell]) -> list[str]:
    """Issue 6's comparison: /v1/messages translated and native, as fractions of /v1/chat/completions."""
    by = {(c.scenario, c.target): c for c in cells}
    out = []
    for target in dict.fromkeys(c.target for c in cells if c.scenario.startswith("messages-")):
        chat = by.get(("messages-chat", target))
        if chat is None or not chat.rps:
            continue
        parts = []
        for name, label in (("messages-translated", "translated"), ("messages-native", "native")):
            c = by.get((name, target))
            if c is not None:
                cpu = (
                    f", {c.cpu_us_per_request:.1f} vs {chat.cpu_us_per_request:.1f} CPU µs/req"
                    if c.cpu_us_per_request and chat.cpu_us_per_request
                    else ""
                )
                parts.append(f"{label} {c.rps:,.0f} req/s = {c.rps / chat.rps:.2f}x{cpu}")
        out.append(f"- {target}: chat completions {chat.rps:,.0f} req/s; " + "; ".join(parts))
    return out


def accounting_lines(cells: Sequence[Cell]) -> list[str]:
    """What rate limits, a budget and usage records cost: the gateway with them against without them."""
    bare = {c.scenario: c for c in cells if c.target == "gateway-bare"}
    out = []
    for c in cells:
        b = bare.get(c.scenario)
        if c.target != "gateway" or b is None or not b.rps or c.scenario == "rate-limited":
            continue
        if c.streams is not None and c.streams.get("mode") == "burst":
            out.append(
                f"- {c.scenario}: CPU {_num(c.cpu_us_per_request, '.0f')} vs "
                f"{_num(b.cpu_us_per_request, '.0f')} µs/stream, peak RSS {_num(c.peak_rss_mib, '.0f')} vs "
                f"{_num(b.peak_rss_mib, '.0f')} MiB"
            )
            continue
        cpu = (
            f", CPU {c.cpu_us_per_request:.1f} vs {b.cpu_us_per_request:.1f} µs/req"
            if c.cpu_us_per_request and b.cpu_us_per_request
            else ""
        )
        out.append(
            f"- {c.scenario}: {c.rps:,.0f} vs {b.rps:,.0f}/s, "
            f"{(1 - c.rps / b.rps) * 100:+.1f}% throughput cost{cpu}"
        )
    return out


def render_markdown(run: Run, meta: dict[str, Any]) -> str:
    args = run.args
    m = meta["machine"]
    versions = ", ".join(f"{k} {v}" for k, v in m["versions"].items())
    cells = medians(run.cells)
    parts = [
        "# Benchmark: single-host gateway",
        "",
        f"- date: {meta['date']} ({meta['elapsed_s']:.0f} s in all)",
        f"- command: `{meta['command']}`",
        f"- machine: {m['nproc']} CPUs ({m['cpu_model']}), {m['memory_gib']} GiB, Linux {m['kernel']}",
        f"- versions: {versions}; git {m['git']}"
        + "".join(f"; {k} {v} (perf/.peers)" for k, v in m.get("peers", {}).items()),
        f"- load: {args.duration} s per cell after {args.warmup} s warm-up (none before the slow-stream "
        f"burst), wrk -t{args.threads}; proxies run {args.workers} workers"
        + (f"; each row the median of {args.rounds} interleaved rounds" if args.rounds > 1 else ""),
        "",
        "Scenarios:",
        "",
        *[f"- `{s.name}`: {s.what}" for s in run.scenarios],
        "",
    ]
    if table := requests_table(run, cells):
        parts += ["## Whole responses (wrk)", "", table, ""]
    if table := streams_table(run, cells):
        parts += [
            "## Streams (perf.streams)",
            "",
            "TTFB: from writing the request to the first byte of the answer; total: to the last byte. CPU per"
            " complete stream. The upstream is the Python mock engine (one process): its CPU is the last"
            " column.",
            "",
            table,
            "",
        ]
    if table := paced_table(run, cells):
        parts += [
            "## Engine-paced streams (perf.paced upstream)",
            "",
            "Max token gap: per complete stream, its longest wait between two tokens (the upstream paces "
            "them 20-50 ms apart; a stall is a gap over the stall threshold). CPU per token: the proxy's "
            "CPU over the complete streams' tokens. PSS: the proxy's processes summed, just before the "
            "burst and at the largest sample while it ran; per stream: (peak - idle) / max open.",
            "",
            table,
            "",
        ]
    if lines := peer_lines(cells):
        parts += ["## Against the peers", "", *lines, ""]
    if table := refusing_table(run, cells):
        parts += ["## Refusing: a rate-limited key", "", table, ""]
    if lines := messages_lines(cells):
        parts += ["## /v1/messages translated and native against /v1/chat/completions", "", *lines, ""]
    if lines := accounting_lines(cells):
        parts += [
            "## Limits, budget and usage records on (gateway) against off (gateway-bare)",
            "",
            *lines,
            "",
        ]
    if run.cells:
        busiest = (
            max(c.upstream_cpu_cores for c in run.cells if c.wrk is not None)
            if any(c.wrk for c in run.cells)
            else 0.0
        )
        other = max(c.other_cores for c in run.cells)
        parts.append(
            f"nginx mock CPU use peaked at {busiest:.2f} cores in any wrk cell; CPU used by neither the"
            f" targets, the upstream nor the load generator (kernel softirq, other processes) peaked at"
            f" {other:.2f} cores of {m['nproc']}. Per-cell CPU, PSS, percentiles and per-process figures are"
            " in latest.json."
        )
    for name, why in run.unavailable.items():
        parts.append(f"\n{name}: {why} (optional; measured when installed, never a dependency).")
    for name, why in run.failures.items():
        parts.append(f"\n**{name} not measured:**\n\n```\n{why.strip()[-2000:]}\n```")
    return "\n".join(parts) + "\n"


def plot(run: Run, out_dir: Path) -> list[Path]:
    """latency.png (latency percentile curves per scenario, a line per target), throughput.png (req/s or
    streams/s per steady-load scenario, a bar per target) and streams.png (per stream scenario: TTFB and
    total-time percentiles, and the proxies' peak RSS)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError:
        print("matplotlib not installed (pip install -e '.[bench]'): no plots", file=sys.stderr)
        return []
    cells = medians(run.cells)
    scenarios = list(dict.fromkeys(c.scenario for c in cells))
    if not scenarios:
        return []
    colours = {t: f"C{i}" for i, t in enumerate(dict.fromkeys(c.target for c in cells))}
    written = []
    plain = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}")  # 0.5, 20, 3400 rather than 3.4x10^3

    def grid(n: int) -> tuple[Any, list[Any]]:
        cols = min(3, n)
        rows = (n + cols - 1) // cols
        fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.6 * rows), squeeze=False)
        flat = list(axes.flat)
        for ax in flat[n:]:
            ax.set_visible(False)
        return fig, flat[:n]

    def curves(ax: Any, title: str, series: list[tuple[str, dict[str, float]]]) -> None:
        # x is the percentile on a "nines" scale (-log10(1 - p)), as HdrHistogram plots it.
        for target, pct in series:
            pts = sorted((float(k), v) for k, v in pct.items() if k != "max")
            if pts:
                xs = [_nines(p) for p, _ in pts]
                ax.plot(xs, [v for _, v in pts], marker="o", ms=3, label=target, color=colours[target])
        ax.set_title(title, fontsize=10)
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_formatter(plain)
        ax.set_xticks([_nines(q) for q in (50, 90, 99, 99.9, 99.99)])
        ax.set_xticklabels(["p50", "p90", "p99", "p99.9", "p99.99"], fontsize=8)
        ax.set_ylabel("ms", fontsize=8)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)

    def bars(ax: Any, title: str, unit: str, row: list[tuple[str, float]]) -> None:
        ax.barh([t for t, _ in row], [v for _, v in row], color=[colours[t] for t, _ in row])
        for i, (_, v) in enumerate(row):
            ax.text(v, i, f" {v:,.0f}", va="center", fontsize=7)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel(unit, fontsize=8)
        ax.invert_yaxis()
        ax.margins(x=0.25)

    fig, axes = grid(len(scenarios))
    for ax, name in zip(axes, scenarios, strict=True):
        curves(ax, name, [(c.target, c.latency_ms) for c in cells if c.scenario == name])
    fig.suptitle("Latency distribution per target (whole response; for streams, whole stream)")
    fig.tight_layout()
    written.append(_save(fig, out_dir / "latency.png"))
    plt.close(fig)

    burst = {c.scenario for c in cells if c.streams is not None and c.streams.get("mode") == "burst"}
    steady = [n for n in scenarios if n not in burst]  # a burst has no steady rate to compare
    if steady:
        fig, axes = grid(len(steady))
        for ax, name in zip(axes, steady, strict=True):
            row = [c for c in cells if c.scenario == name]
            unit = "streams/s" if row[0].streams is not None else "req/s"
            bars(ax, name, unit, [(c.target, c.rps) for c in row])
        fig.suptitle("Throughput per scenario")
        fig.tight_layout()
        written.append(_save(fig, out_dir / "throughput.png"))
        plt.close(fig)

    stream_scenarios = [n for n in scenarios if any(c.streams for c in cells if c.scenario == n)]
    if stream_scenarios:
        n = len(stream_scenarios)
        fig, grid_axes = plt.subplots(n, 3, figsize=(15.6, 3.6 * n), squeeze=False)
        for (ttfb_ax, total_ax, mem_ax), name in zip(grid_axes, stream_scenarios, strict=True):
            row = [c for c in cells if c.scenario == name and c.streams is not None]
            curves(ttfb_ax, f"{name}: TTFB", [(c.target, (c.streams or {}).get("ttfb_ms", {})) for c in row])
            curves(total_ax, f"{name}: whole stream", [(c.target, c.latency_ms) for c in row])
            mem = [(c.target, c.peak_rss_mib) for c in row if c.peak_rss_mib is not None]
            bars(mem_ax, f"{name}: peak RSS, proxy processes summed", "MiB", mem)
        fig.tight_layout()
        written.append(_save(fig, out_dir / "streams.png"))
        plt.close(fig)

    paced = {s.name: s.connections for s in run.scenarios if s.group == PACED_GROUP}
    paced_cells = [c for c in cells if c.scenario in paced and c.target != "direct"]
    if paced_cells:
        fig, (cpu_ax, mem_ax) = plt.subplots(1, 2, figsize=(11, 4))
        for target in dict.fromkeys(c.target for c in paced_cells):
            mine = sorted((c for c in paced_cells if c.target == target), key=lambda c: paced[c.scenario])
            for ax, key in ((cpu_ax, "cpu_us_per_token"), (mem_ax, "pss_per_stream_kib")):
                pts = [(paced[c.scenario], getattr(c, key)) for c in mine if getattr(c, key) is not None]
                if pts:
                    ax.plot(*zip(*pts, strict=True), marker="o", label=target, color=colours[target])
        for ax, title, unit in (
            (cpu_ax, "CPU per token, proxy processes", "µs"),
            (mem_ax, "PSS per open stream above idle", "KiB"),
        ):
            ax.set_title(title, fontsize=10)
            ax.set_xlabel("concurrent streams", fontsize=8)
            ax.set_ylabel(unit, fontsize=8)
            ax.set_xticks(sorted(set(paced.values())))
            ax.set_ylim(bottom=0)
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=7)
        lo, hi = run.args.paced_ms
        fig.suptitle(
            f"Engine-paced streams ({run.args.paced_tokens} tokens, one every {lo:g}-{hi:g} ms per stream)"
        )
        fig.tight_layout()
        written.append(_save(fig, out_dir / "engine-paced.png"))
        plt.close(fig)
    return written


def _nines(percentile: float) -> float:
    return -math.log10(max(1 - percentile / 100, 1e-9))


def _save(fig: Any, path: Path) -> Path:
    fig.savefig(path, dpi=110)
    return path
