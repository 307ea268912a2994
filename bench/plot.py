#!/usr/bin/env python3
"""Turns bench/run.sh's JSON into PNG plots (docs/img/) and Markdown tables (stdout).

    python3 bench/plot.py [results-dir] [--img docs/img] [--no-plots]

Reads executors.json, block_size.json and density.json from results-dir (default
build/bench-results), whichever exist. Rows are Google Benchmark medians
(--benchmark_report_aggregates_only); row names are key:value fields split by '/', as every
bench program's opening comment describes. Needs python3-matplotlib for the plots only.
"""

import argparse
import json
import math
import os
import sys
from collections import defaultdict

SKIP_FIELDS = {"min_time", "real_time", "iterations", "repeats"}


def parse_name(name):
    """'decode/exec:simd/threads:2/sel:1/8/N:4096/min_time:0.100/real_time' -> ('decode', {...})."""
    parts = name.split("/")
    kind, fields, last = parts[0], {}, None
    for p in parts[1:]:
        if ":" in p:
            key, value = p.split(":", 1)
            if key in SKIP_FIELDS:
                last = None
                continue
            fields[key] = value
            last = key
        elif p in SKIP_FIELDS:
            last = None
        elif last is not None:  # 'sel:1/8' was split at its '/'
            fields[last] += "/" + p
    return kind, fields


def load(path, stat="median"):
    """Rows of one JSON file: (kind, fields, entry) for the chosen aggregate."""
    with open(path) as f:
        doc = json.load(f)
    rows = []
    for b in doc["benchmarks"]:
        if b.get("run_type") == "aggregate" and b.get("aggregate_name") != stat:
            continue
        if b.get("error_occurred"):
            print(f"plot.py: {b['name']}: {b.get('error_message')}", file=sys.stderr)
            continue
        kind, fields = parse_name(b.get("run_name", b["name"]))
        rows.append((kind, fields, b))
    return doc.get("context", {}), rows


def seconds(b):
    scale = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}[b.get("time_unit", "ns")]
    return b["real_time"] * scale


def share(sel):
    """'1/8' -> 8."""
    return int(sel.split("/")[1])


def table(headers, rows):
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


# --------------------------------------------------------------------------------------------
def executors(rows, img, plt):
    gemm = {f["dim"]: b["flops"] / 1e9 for k, f, b in rows if k == "gemm"}
    attn = {(f["dim"], f["threads"]): b["flops"] / 1e9 for k, f, b in rows
            if k == "prefill" and f.get("peer") == "eigen_attention"}
    stream = {(f["dim"], f["kv"], f["N"]): b["bytes"] / 1e9 for k, f, b in rows
              if k == "decode" and f.get("peer") == "stream"}
    pre = [(f, b["flops"] / 1e9) for k, f, b in rows if k == "prefill" and "exec" in f]
    dec = [(f, b["bytes"] / 1e9) for k, f, b in rows if k == "decode" and "exec" in f]
    execs = sorted({f["exec"] + "/" + f["threads"] for f, _ in pre + dec},
                   key=lambda e: (not e.startswith("scalar"), e))
    bks = sorted({int(f["bk"]) for f, _ in pre + dec})
    dtypes = [d for d in ("fp32", "fp16", "bf16") if any(f["kv"] == d for f, _ in pre + dec)]

    print("### Prefill, causal, N = 4096: GFLOP/s on visible pairs (medians)\n")
    print("Peers in the same run: " + ", ".join(
        f"d={d}: Eigen GEMM {gemm[d]:.0f}, Eigen attention {attn.get((d, '2'), float('nan')):.0f} (2 threads) / "
        f"{attn.get((d, '1'), float('nan')):.0f} (1 thread)" for d in sorted(gemm, key=int)) + " GFLOP/s.\n")
    hdr = ["executor", "dim", "K/V"] + [f"bk {bk}" for bk in bks] + ["best / Eigen GEMM"]
    body = []
    for e in execs:
        for d in sorted({f["dim"] for f, _ in pre}, key=int):
            for dt in dtypes:
                r = {int(f["bk"]): v for f, v in pre
                     if f["exec"] + "/" + f["threads"] == e and f["dim"] == d and f["kv"] == dt}
                if not r:
                    continue
                best = max(r.values())
                body.append([e.replace("/", ", threads ").replace("threads ", "threads "), d, dt] +
                            [f"{r[bk]:.0f}" if bk in r else "" for bk in bks] +
                            [f"{best / gemm[d]:.0%}" if d in gemm else ""])
    print(table(hdr, body) + "\n")

    print("### Decode, one query: GB/s on the selected K+V bytes (medians)\n")
    hdr = ["executor", "N", "dim", "K/V", "sel"] + [f"bk {bk}" for bk in bks] + ["stream", "best / stream"]
    body = []
    for e in execs:
        for n in sorted({f["N"] for f, _ in dec}, key=int):
            for d in sorted({f["dim"] for f, _ in dec}, key=int):
                for dt in dtypes:
                    for sel in ("all", "1/8"):
                        r = {int(f["bk"]): v for f, v in dec
                             if f["exec"] + "/" + f["threads"] == e and f["N"] == n and f["dim"] == d
                             and f["kv"] == dt and f["sel"] == sel}
                        if not r:
                            continue
                        s = stream.get((d, dt, n))
                        best = max(r.values())
                        body.append([e.replace("/", ", threads "), n, d, dt, sel] +
                                    [f"{r[bk]:.1f}" if bk in r else "" for bk in bks] +
                                    [f"{s:.1f}" if s else "", f"{best / s:.0%}" if s else ""])
    print(table(hdr, body) + "\n")

    if plt is None:
        return
    # Prefill: one panel per (dim, dtype), bars per executor and bk, the peers as lines.
    dims = sorted({f["dim"] for f, _ in pre}, key=int)
    fig, axes = plt.subplots(len(dims), len(dtypes), figsize=(4.2 * len(dtypes), 3.4 * len(dims)),
                             squeeze=False, sharey=True)
    width = 0.8 / max(1, len(execs))
    for i, d in enumerate(dims):
        for j, dt in enumerate(dtypes):
            ax = axes[i][j]
            for x, e in enumerate(execs):
                r = {int(f["bk"]): v for f, v in pre
                     if f["exec"] + "/" + f["threads"] == e and f["dim"] == d and f["kv"] == dt}
                ax.bar([bks.index(bk) + (x - (len(execs) - 1) / 2) * width for bk in r], list(r.values()),
                       width, label=e.replace("/", ", threads "))
            if d in gemm:
                ax.axhline(gemm[d], color="k", ls="-", lw=1, label="Eigen GEMM (2 threads)")
                ax.axhline(0.7 * gemm[d], color="k", ls=":", lw=1, label="70% of Eigen GEMM")
            if (d, "2") in attn:
                ax.axhline(attn[(d, "2")], color="tab:red", ls="--", lw=1, label="Eigen attention fp32 (2 threads)")
            ax.set_xticks(range(len(bks)), [str(b) for b in bks])
            ax.set_title(f"prefill N=4096, d={d}, K/V {dt}", fontsize=9)
            ax.set_xlabel("bk")
            if j == 0:
                ax.set_ylabel("GFLOP/s (visible pairs)")
    axes[0][0].legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(os.path.join(img, "bench-executors-prefill.png"), dpi=110)
    plt.close(fig)

    # Decode (every block): one panel per (N, dtype) at the largest dim, stream as the ceiling.
    ns = sorted({f["N"] for f, _ in dec}, key=int)
    dmax = max((f["dim"] for f, _ in dec), key=int, default=None)
    if dmax is None:
        return
    fig, axes = plt.subplots(len(ns), len(dtypes), figsize=(4.2 * len(dtypes), 3.2 * len(ns)),
                             squeeze=False, sharey=True)
    for i, n in enumerate(ns):
        for j, dt in enumerate(dtypes):
            ax = axes[i][j]
            for x, e in enumerate(execs):
                r = {int(f["bk"]): v for f, v in dec if f["exec"] + "/" + f["threads"] == e and f["N"] == n
                     and f["dim"] == dmax and f["kv"] == dt and f["sel"] == "all"}
                ax.bar([bks.index(bk) + (x - (len(execs) - 1) / 2) * width for bk in r], list(r.values()),
                       width, label=e.replace("/", ", threads "))
            s = stream.get((dmax, dt, n))
            if s:
                ax.axhline(s, color="k", lw=1, label="streaming read, same bytes (2 threads)")
                ax.axhline(0.7 * s, color="k", ls=":", lw=1, label="70% of streaming read")
            ax.set_xticks(range(len(bks)), [str(b) for b in bks])
            ax.set_title(f"decode N={n}, d={dmax}, K/V {dt}, every block", fontsize=9)
            ax.set_xlabel("bk")
            if j == 0:
                ax.set_ylabel("GB/s (K+V read once)")
    axes[0][0].legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(os.path.join(img, "bench-executors-decode.png"), dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------------------------
def block_size(rows, img, plt):
    sp = [(f, b) for k, f, b in rows if k == "prefill" and f.get("step") == "sparse"]
    dn = {f["N"]: seconds(b) for k, f, b in rows if k == "prefill" and f.get("step") == "dense"}
    if not sp:
        return
    print("### Block size: sparse step (chunk of 512 queries), stages and quality (medians)\n")
    hdr = ["N", "bk", "budget", "density", "step ms", "vs dense", "summarize", "score", "select", "execute",
           "coverage", "coverage p5", "recall@8", "needle", "error"]
    body = []
    for f, b in sorted(sp, key=lambda x: (int(x[0]["N"]), int(x[0]["bk"]), share(x[0]["sel"]))):
        t = seconds(b)
        body.append([f["N"], f["bk"], f["sel"], f"{b['density']:.3f}", f"{t * 1e3:.2f}",
                     f"{t / dn[f['N']]:.2f}x" if f["N"] in dn else "",
                     *(f"{b[s + '_s'] * 1e3:.2f}" for s in ("summarize", "score", "select", "execute")),
                     f"{b['coverage']:.3f}", f"{b['coverage_p5']:.3f}", f"{b['recall8']:.3f}",
                     f"{b['needle']:.3f}", f"{b['error']:.1e}"])
    print("Stage columns in ms per step (each kv head on its own thread; a stage's time is the mean over "
          "the threads). Dense (same executor, every causal block): " +
          ", ".join(f"N={n}: {t * 1e3:.1f} ms" for n, t in sorted(dn.items(), key=lambda x: int(x[0]))) + ".\n")
    print(table(hdr, body) + "\n")
    if plt is None:
        return
    n = max({f["N"] for f, _ in sp}, key=int)
    cur = [(f, b) for f, b in sp if f["N"] == n]
    bks = sorted({int(f["bk"]) for f, _ in cur})
    shares = sorted({share(f["sel"]) for f, _ in cur})
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for bk in bks:
        r = sorted([(b["density"], b["coverage"], b["recall8"]) for f, b in cur if int(f["bk"]) == bk])
        axes[0].plot([x[0] for x in r], [x[1] for x in r], "o-", label=f"bk {bk}")
        axes[1].plot([x[0] for x in r], [x[2] for x in r], "o-", label=f"bk {bk}")
    for ax, what in ((axes[0], "mass coverage (mean)"), (axes[1], "recall@8")):
        ax.set_xscale("log")
        ax.set_xlabel("density (share of causal pairs selected)")
        ax.set_ylabel(what)
        ax.set_title(f"N={n}: {what} vs density", fontsize=9)
        ax.legend(fontsize=8)
    ax = axes[2]
    labels, bottoms = [], None
    stages = ("summarize", "score", "select", "execute")
    x = 0
    ticks = []
    for bk in bks:
        for s in shares:
            row = [b for f, b in cur if int(f["bk"]) == bk and share(f["sel"]) == s]
            if not row:
                continue
            bottom = 0.0
            for k, st in enumerate(stages):
                v = row[0][st + "_s"] * 1e3
                ax.bar(x, v, 0.8, bottom=bottom, color=f"C{k}", label=st if x == 0 else None)
                bottom += v
            ticks.append((x, f"{bk}\n1/{s}"))
            x += 1
        x += 0.5
    if n in dn:
        ax.axhline(dn[n] * 1e3, color="k", ls="--", lw=1, label="dense (same executor)")
    ax.set_xticks([t[0] for t in ticks], [t[1] for t in ticks], fontsize=6)
    ax.set_ylabel("ms per step")
    ax.set_title(f"N={n}: stage times per bk and budget", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(img, "bench-block-size.png"), dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------------------------
def density(rows, img, plt):
    out = {}
    order = {"prefill": 0, "prefill_full": 1, "decode": 2}
    groups = {(k, f["threads"], f.get("kv", "NHD")) for k, f, _ in rows if "step" in f}
    for mode, threads, kv in sorted(groups, key=lambda x: (order.get(x[0], 3), x[1], x[2])):
        mine = [(f, b) for k, f, b in rows if k == mode and f["threads"] == threads and f.get("kv", "NHD") == kv]
        dn = {int(f["N"]): seconds(b) for f, b in mine if f.get("step") == "dense"}
        sp = [(int(f["N"]), share(f["sel"]), b) for f, b in mine if f.get("step") == "sparse"]
        if not sp:
            continue
        what = {"prefill": "chunk of 512 queries", "prefill_full": "whole causal prefill"}.get(mode, "one query")
        mode = f"{mode}, {threads} thread" + ("s" if threads != "1" else "") + f", K/V {kv}"
        ns = sorted({n for n, _, _ in sp})
        shares = sorted({s for _, s, _ in sp})
        ratio = {(n, s): seconds(b) / dn[n] for n, s, b in sp if n in dn}
        dens = {(n, s): b["density"] for n, s, b in sp}
        out[mode] = (ns, shares, ratio, dens, dn)
        print(f"### Density crossover, {mode} ({what}): sparse step time / dense time (medians; < 1: sparse wins)\n")
        hdr = ["N", "dense ms"] + [f"1/{s}" for s in shares]
        body = [[n, f"{dn[n] * 1e3:.2f}" if n in dn else ""] +
                [f"{ratio[(n, s)]:.2f}" if (n, s) in ratio else "" for s in shares] for n in ns]
        print(table(hdr, body) + "\n")
        losses = [(n, s) for (n, s), r in ratio.items() if r >= 1.0]
        if losses:
            print("Sparse loses (ratio >= 1) at: " + ", ".join(f"N={n} budget 1/{s}" for n, s in sorted(losses)) + "\n")
    if plt is None or not out:
        return
    cols = min(len(out), 3)
    rows_ = (len(out) + cols - 1) // cols
    fig, axes = plt.subplots(rows_, cols, figsize=(6 * cols, 4 * rows_), squeeze=False)
    for ax in axes.flat[len(out):]:
        ax.axis("off")
    for ax, (mode, (ns, shares, ratio, dens, dn)) in zip(axes.flat, out.items()):
        for s in shares:
            pts = [(n, ratio[(n, s)]) for n in ns if (n, s) in ratio]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=f"budget 1/{s}")
        ax.axhline(1.0, color="k", lw=1, label="dense (crossover)")
        ax.axhline(0.2, color="k", ls=":", lw=1, label="0.2x target (1/8, N=32K)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("N (keys)")
        ax.set_ylabel("time(sparse step) / time(dense)")
        ax.set_title(f"{mode}: all stages vs dense, same executor", fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(img, "bench-density.png"), dpi=110)
    plt.close(fig)


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="?", default=os.path.join(root, "build", "bench-results"))
    ap.add_argument("--img", default=os.path.join(root, "docs", "img"))
    ap.add_argument("--no-plots", action="store_true")
    args = ap.parse_args()
    plt = None
    if not args.no_plots:
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt  # noqa: F811
        except ImportError:
            # Debian's python3-matplotlib lives in /usr/bin/python3's packages; a python3 earlier on
            # PATH (pyenv, a venv) does not see it.
            system = "/usr/bin/python3"
            if os.path.realpath(sys.executable) != os.path.realpath(system) and os.path.exists(system) \
                    and not os.environ.get("SKIM_PLOT_REEXEC"):
                os.environ["SKIM_PLOT_REEXEC"] = "1"
                os.execv(system, [system, os.path.abspath(__file__)] + sys.argv[1:])
            print("plot.py: no matplotlib (apt-get install python3-matplotlib): tables only", file=sys.stderr)
        os.makedirs(args.img, exist_ok=True)
    found = False
    for name, fn in (("executors", executors), ("block_size", block_size), ("density", density)):
        path = os.path.join(args.results, name + ".json")
        if not os.path.exists(path):
            continue
        try:
            ctx, rows = load(path)
        except (json.JSONDecodeError, KeyError) as e:
            print(f"plot.py: {path}: unreadable ({e}); is its run still going?", file=sys.stderr)
            continue
        found = True
        print(f"<!-- {name}: {ctx.get('date', '')}, {ctx.get('num_cpus', '?')} CPUs at "
              f"{ctx.get('mhz_per_cpu', '?')} MHz, load {ctx.get('load_avg', '')} -->\n")
        fn(rows, args.img, plt)
    if not found:
        print(f"plot.py: no executors/block_size/density .json in {args.results}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
