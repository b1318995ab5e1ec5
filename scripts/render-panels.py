#!/usr/bin/env python3
"""Evaluates a Grafana dashboard's panel queries on a Prometheus and draws each panel.

Usage: render-panels.py PANELS_JSON PROMETHEUS_URL START END STEP OUT_DIR

PANELS_JSON: [{"title", "type", "unit", "targets": [{"expr", "legend", "instant"}]}]
with Grafana's variables already substituted (testbed/tests/common/monitoring.rs does
that). Range queries (/api/v1/query_range, START..END Unix seconds, STEP seconds) for
time-series panels, instant queries at END for table targets. Writes OUT_DIR/NN-title.png
per panel (matplotlib; UTC time axis) and OUT_DIR/summary.json:
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


summary = []
for i, p in enumerate(json.load(open(panels_file))):
    title = p["title"]
    slug = re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")
    png = os.path.join(out_dir, f"{i:02d}-{slug}.png")
    fig, ax = plt.subplots(figsize=(9, 4), dpi=80)
    rows = []
    targets = []
    for t in p["targets"]:
        entry = {"expr": t["expr"], "series": 0, "points": 0, "error": None}
        try:
            if t.get("instant"):
                res = query("/api/v1/query", {"query": t["expr"], "time": end})
                for s in res:
                    v = num(s["value"][1])
                    rows.append((legend("", s["metric"]), v))
                    entry["points"] += 0 if math.isnan(v) else 1
            else:
                res = query("/api/v1/query_range", {"query": t["expr"], "start": start, "end": end, "step": step})
                for s in res:
                    xs = [dt.datetime.fromtimestamp(float(ts), dt.timezone.utc) for ts, _ in s["values"]]
                    ys = [num(v) for _, v in s["values"]]
                    entry["points"] += sum(1 for y in ys if not math.isnan(y))
                    style = "--" if "baseline" in (t.get("legend") or "") or "threshold" in (t.get("legend") or "") else "-"
                    if p["type"] == "heatmap":
                        ax.plot(xs, ys, style, label=f"le={s['metric'].get('le', '')}", linewidth=1)
                    else:
                        ax.plot(xs, ys, style, label=legend(t.get("legend", ""), s["metric"]), linewidth=1.5)
            entry["series"] = len(res)
        except Exception as e:  # noqa: BLE001 - reported per query
            entry["error"] = str(e)
        targets.append(entry)
    if rows:
        ax.axis("off")
        cells = [[name, f"{v:.4g}"] for name, v in rows]
        ax.table(cellText=cells[:30], colLabels=["series", "value"], loc="center", cellLoc="left")
    else:
        ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S", tz=dt.timezone.utc))
        ax.set_xlabel("UTC")
        if p.get("unit"):
            ax.set_ylabel(p["unit"])
        handles, labels = ax.get_legend_handles_labels()
        if handles:
            ax.legend(fontsize=7, loc="upper left", ncol=2)
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(png)
    plt.close(fig)
    summary.append({"title": title, "png": png, "targets": targets})

with open(os.path.join(out_dir, "summary.json"), "w") as f:
    json.dump(summary, f, indent=1)
