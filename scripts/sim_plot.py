#!/usr/bin/env python3
"""Plots meshccl_sim's CSV: per collective, the bus bandwidth of the tuner's
pick against size, one line per rank count; and, for the first collective at
the largest rank count, every candidate's bus bandwidth (the pick marked).

Usage: scripts/sim_plot.py CSV PNG   (meshccl_sim --png runs it)
"""
import csv
import math
import os
import sys


def load(path):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        sys.exit(f"sim_plot: {path} has no rows")
    for r in rows:
        for k in ("nranks", "nhosts", "bytes", "allowed", "picked"):
            r[k] = int(float(r[k]))
        for k in ("time_us", "algbw_gbs", "busbw_gbs"):
            r[k] = float(r[k])
    return rows


def draw(rows, png, plt):
    colls = list(dict.fromkeys(r["collective"] for r in rows))
    ranks = sorted({r["nranks"] for r in rows})
    panels = len(colls) + 1
    cols = min(panels, 3)
    lines = math.ceil(panels / cols)
    fig, axes = plt.subplots(lines, cols, figsize=(6 * cols, 4 * lines), squeeze=False)
    cmap = plt.get_cmap("viridis")
    for i, coll in enumerate(colls):
        ax = axes[i // cols][i % cols]
        for j, n in enumerate(ranks):
            pts = sorted((r["bytes"], r["busbw_gbs"]) for r in rows
                         if r["collective"] == coll and r["nranks"] == n and r["picked"])
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=".",
                        color=cmap(j / max(1, len(ranks) - 1)), label=f"{n} ranks")
        ax.set_title(f"{coll}: the tuner's pick")
        style(ax)
        if len(ranks) <= 12:
            ax.legend(fontsize=7)
    ax = axes[len(colls) // cols][len(colls) % cols]
    coll, n = colls[0], ranks[-1]
    sub = [r for r in rows if r["collective"] == coll and r["nranks"] == n]
    for algo in dict.fromkeys(r["algorithm"] for r in sub):
        pts = sorted((r["bytes"], r["busbw_gbs"], r["picked"]) for r in sub
                     if r["algorithm"] == algo and math.isfinite(r["busbw_gbs"]))
        if not pts:
            continue
        line, = ax.plot([p[0] for p in pts], [p[1] for p in pts], label=algo)
        picked = [p for p in pts if p[2]]
        ax.plot([p[0] for p in picked], [p[1] for p in picked], "o", color=line.get_color(), markersize=4)
    ax.set_title(f"{coll} on {n} ranks: every candidate (dots: picked)")
    style(ax)
    ax.legend(fontsize=7)
    for k in range(panels, lines * cols):
        axes[k // cols][k % cols].axis("off")
    fig.suptitle(f"meshccl_sim: {rows[0]['cluster'].split(':')[0]}, {ranks[0]} to {ranks[-1]} ranks")
    fig.tight_layout()
    fig.savefig(png, dpi=90)


def style(ax):
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("size (bytes)")
    ax.set_ylabel("busbw (GB/s)")
    ax.grid(True, which="both", alpha=0.3)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        # A python3 first on PATH (pyenv, a venv) may lack the Debian
        # matplotlib that the system interpreter has: let that one draw.
        system = "/usr/bin/python3"
        if os.path.realpath(sys.executable) != os.path.realpath(system) and os.access(system, os.X_OK):
            os.execv(system, [system, os.path.abspath(__file__)] + sys.argv[1:])
        sys.exit("sim_plot: matplotlib is not installed (apt-get install python3-matplotlib)")
    draw(load(sys.argv[1]), sys.argv[2], plt)


if __name__ == "__main__":
    main()
