#!/usr/bin/env python3
"""Summarise `dockhand bench` output and draw the W2 drain-vs-concurrency chart.

Usage: python3 docs/bench_chart.py docs/bench-results.txt docs/drain_vs_concurrency.svg

Reads the raw `key=value` lines (lines starting with `#` are the commands), prints the median
of every (peer, workload, concurrency, durability) figure as Markdown rows, and writes an SVG
line chart of the median W2 jobs/s per concurrency for each peer (durable settings only).
No plotting library: the SVG is written by hand.
"""

import statistics
import sys
from collections import defaultdict


def parse(path):
    rows = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line.startswith("peer="):
                continue
            rows.append(dict(kv.split("=", 1) for kv in line.split()))
    return rows


def medians(rows):
    groups = defaultdict(list)
    for r in rows:
        key = (r["peer"], r["workload"], r.get("concurrency", ""), r["durability"])
        groups[key].append(r)
    out = {}
    for key, rs in groups.items():
        m = {"runs": len(rs)}
        for field in ("secs", "jobs_per_sec", "items_per_sec", "p50_ms", "p99_ms", "dup"):
            vals = [float(r[field]) for r in rs if field in r]
            if vals:
                m[field] = statistics.median(vals)
                m[field + "_all"] = vals
        out[key] = m
    return out


def svg(series, path):
    """series: {label: [(concurrency, jobs_per_sec)]}"""
    w, h = 720, 400
    left, right, top, bottom = 80, 170, 40, 50
    pw, ph = w - left - right, h - top - bottom
    xs = sorted({c for pts in series.values() for c, _ in pts})
    ymax = max(v for pts in series.values() for _, v in pts)
    step = 10 ** (len(str(int(ymax))) - 1)
    ytop = ((int(ymax) // step) + 1) * step

    def x(c):
        # Evenly spaced (the concurrencies double), with a margin at both ends.
        return left + 30 + (pw - 60) * xs.index(c) / max(1, len(xs) - 1)

    def y(v):
        return top + ph * (1 - v / ytop)

    colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
        f'viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">',
        f'<rect width="{w}" height="{h}" fill="white"/>',
        f'<text x="{left + pw / 2}" y="22" text-anchor="middle" font-size="14">'
        "W2 drain throughput vs runtime concurrency (n=10000, durable)</text>",
    ]
    for i in range(6):
        v = ytop * i / 5
        out.append(
            f'<line x1="{left}" y1="{y(v):.1f}" x2="{left + pw}" y2="{y(v):.1f}" '
            'stroke="#ddd"/>'
        )
        out.append(
            f'<text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v:,.0f}</text>'
        )
    for c in xs:
        out.append(
            f'<text x="{x(c):.1f}" y="{top + ph + 18}" text-anchor="middle">{c}</text>'
        )
    out.append(
        f'<line x1="{left}" y1="{top + ph}" x2="{left + pw}" y2="{top + ph}" stroke="black"/>'
    )
    out.append(f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + ph}" stroke="black"/>')
    out.append(
        f'<text x="{left + pw / 2}" y="{h - 12}" text-anchor="middle">'
        "concurrency (runtime slots)</text>"
    )
    out.append(
        f'<text x="16" y="{top + ph / 2}" text-anchor="middle" '
        f'transform="rotate(-90 16 {top + ph / 2})">jobs/s (median of the runs)</text>'
    )
    for i, (label, pts) in enumerate(sorted(series.items())):
        color = colors[i % len(colors)]
        pts = sorted(pts)
        path_d = " ".join(f"{x(c):.1f},{y(v):.1f}" for c, v in pts)
        out.append(
            f'<polyline points="{path_d}" fill="none" stroke="{color}" stroke-width="2"/>'
        )
        for c, v in pts:
            out.append(f'<circle cx="{x(c):.1f}" cy="{y(v):.1f}" r="3.5" fill="{color}"/>')
            out.append(
                f'<text x="{x(c):.1f}" y="{y(v) - 8:.1f}" text-anchor="middle" '
                f'fill="{color}">{v:,.0f}</text>'
            )
        ly = top + 20 + 22 * i
        out.append(
            f'<line x1="{left + pw + 15}" y1="{ly}" x2="{left + pw + 35}" y2="{ly}" '
            f'stroke="{color}" stroke-width="2"/>'
        )
        out.append(f'<text x="{left + pw + 40}" y="{ly + 4}">{label}</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def main():
    rows = parse(sys.argv[1])
    med = medians(rows)
    for (peer, wl, conc, dur), m in sorted(med.items()):
        if "jobs_per_sec" in m:
            figure = f"jobs/s {m['jobs_per_sec']:,.0f} (runs: " + ", ".join(
                f"{v:,.0f}" for v in m["jobs_per_sec_all"]
            ) + ")"
        elif "items_per_sec" in m:
            # W4 (pipeline items/s).
            figure = f"items/s {m['items_per_sec']:,.0f} (runs: " + ", ".join(
                f"{v:,.0f}" for v in m["items_per_sec_all"]
            ) + ")"
        else:
            figure = (
                f"p50 {m['p50_ms']:.2f} ms, p99 {m['p99_ms']:.2f} ms (p99 runs: "
                + ", ".join(f"{v:.2f}" for v in m["p99_ms_all"])
                + ")"
            )
        print(f"| {peer} | {wl} | {conc or '-'} | {dur} | {figure} | dup {m.get('dup', '-')} |")
    series = defaultdict(list)
    for (peer, wl, conc, dur), m in med.items():
        durable = not dur.endswith("-off")
        if wl == "W2" and conc and durable:
            series[peer].append((int(conc), m["jobs_per_sec"]))
    if len(sys.argv) > 2:
        svg(series, sys.argv[2])


if __name__ == "__main__":
    main()
