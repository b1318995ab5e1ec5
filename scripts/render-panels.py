#!/usr/bin/env python3
"""Evaluates a Grafana dashboard's panel queries on a Prometheus and draws each panel.

Usage: render-panels.py PANELS_JSON PROMETHEUS_URL START END STEP OUT_DIR

PANELS_JSON: [{"title", "type", "unit", "targets": [{"expr", "legend", "instant", "column"}]}]
with Grafana's variables already substituted (testbed/tests/common/monitoring.rs does
that). Range queries (/api/v1/query_range, START..END Unix seconds, STEP seconds) for
time-series panels, instant queries at END for table targets (one row per series key,
one column per target, named by "column"); a heatmap panel's cumulative buckets are
drawn as counts per bucket over time; series that are 0 throughout are left out of the
drawing (they still count as data), except baselines and thresholds. Writes OUT_DIR/NN-title.png per panel (matplotlib;
UTC time axis) and OUT_DIR/summary.json:
[{"title", "png", "targets": [{"expr", "series", "points", "error"}]}] — "series" is the
number of series the query returned, "points" the number of non-NaN values.
Needs matplotlib (scripts/render-env.sh makes a venv with it).
"""
import datetime as dt
import json
import math
import os
import re
import sys
import urllib.parse
import urllib.request

import matplotlib

matplotlib.use("Agg")
import matplotlib.dates as mdates  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402

panels_file, prom, start, end, step, out_dir = sys.argv[1:7]
start, end, step = float(start), float(end), float(step)
os.makedirs(out_dir, exist_ok=True)


def query(path, params):
    url = f"{prom}{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=30) as r:
        body = json.load(r)
    if body.get("status") != "success":
        raise RuntimeError(body.get("error", "query failed"))
    return body["data"]["result"]


def legend(fmt, metric):
    if not fmt:
        return "{" + ", ".join(f"{k}={v}" for k, v in sorted(metric.items()) if k != "__name__") + "}"
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: metric.get(m.group(1), ""), fmt)


def num(v):
    try:
        return float(v)
    except ValueError:
        return math.nan


def heatmap(ax, res):
    """Cumulative `le` buckets (one series each) to counts per bucket, drawn over time."""
    buckets = sorted(res, key=lambda s: math.inf if s["metric"].get("le") == "+Inf" else float(s["metric"].get("le", "nan")))
    if not buckets:
        return
    times = [float(ts) for ts, _ in buckets[0]["values"]]
    cum = []
    for s in buckets:
        by_t = {float(ts): num(v) for ts, v in s["values"]}
        cum.append([by_t.get(t, math.nan) for t in times])
    rows = [cum[0]] + [[b - a for a, b in zip(cum[i - 1], cum[i])] for i in range(1, len(cum))]
    les = [s["metric"].get("le", "") for s in buckets]
    xs = mdates.date2num([dt.datetime.fromtimestamp(t, dt.timezone.utc) for t in times])
    mesh = ax.pcolormesh(xs, range(len(les)), [[0 if math.isnan(v) else max(v, 0) for v in r] for r in rows], cmap="Oranges", shading="nearest")
    ax.set_yticks(range(len(les)))
    ax.set_yticklabels([f"≤{le}" for le in les], fontsize=6)
    ax.set_ylabel("TTFP bucket (s)")
    plt.colorbar(mesh, ax=ax, label="probes")


summary = []
for i, p in enumerate(json.load(open(panels_file))):
    title = p["title"]
    slug = re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")
    png = os.path.join(out_dir, f"{i:02d}-{slug}.png")
    fig, ax = plt.subplots(figsize=(9, 4), dpi=80)
    table = {}
    columns = []
    targets = []
    drawn = 0
    for t in p["targets"]:
        entry = {"expr": t["expr"], "series": 0, "points": 0, "error": None}
        try:
            if t.get("instant"):
                col = t.get("column") or t["expr"][:30]
                columns.append(col)
                res = query("/api/v1/query", {"query": t["expr"], "time": end})
                for s in res:
                    v = num(s["value"][1])
                    table.setdefault(legend("", s["metric"]), {})[col] = v
                    entry["points"] += 0 if math.isnan(v) else 1
            else:
                res = query("/api/v1/query_range", {"query": t["expr"], "start": start, "end": end, "step": step})
                for s in res:
                    ys = [num(v) for _, v in s["values"]]
                    entry["points"] += sum(1 for y in ys if not math.isnan(y))
                if p["type"] == "heatmap":
                    heatmap(ax, res)
                    drawn += len(res)
                else:
                    for s in res:
                        ys = [num(v) for _, v in s["values"]]
                        lg = t.get("legend") or ""
                        reference = "baseline" in lg or "threshold" in lg
                        if not reference and all(y == 0 or math.isnan(y) for y in ys):
                            continue
                        xs = [dt.datetime.fromtimestamp(float(ts), dt.timezone.utc) for ts, _ in s["values"]]
                        style = "--" if reference else "-"
                        ax.plot(xs, ys, style, label=legend(lg, s["metric"]), linewidth=1.5)
                        drawn += 1
            entry["series"] = len(res)
        except Exception as e:  # noqa: BLE001 - reported per query
            entry["error"] = str(e)
        targets.append(entry)
    if columns:
        ax.axis("off")
        cells = [[key] + [f"{row[c]:.3g}" if c in row else "" for c in columns] for key, row in sorted(table.items())]
        if cells:
            tab = ax.table(cellText=cells[:30], colLabels=["series"] + columns, loc="center", cellLoc="left")
            tab.auto_set_font_size(False)
            tab.set_fontsize(7)
    else:
        ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S", tz=dt.timezone.utc))
        ax.set_xlabel("UTC")
        if p.get("unit") and p["type"] != "heatmap":
            ax.set_ylabel(p["unit"])
        handles, _ = ax.get_legend_handles_labels()
        if handles:
            ax.legend(fontsize=7, loc="upper left", ncol=2)
    if drawn == 0 and not table:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, fontsize=14)
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(png)
    plt.close(fig)
    summary.append({"title": title, "png": png, "targets": targets})

with open(os.path.join(out_dir, "summary.json"), "w") as f:
    json.dump(summary, f, indent=1)
