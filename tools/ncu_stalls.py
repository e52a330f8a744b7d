#!/usr/bin/env python3
"""Warp-state summary of an Nsight Compute source-counter export.

Reads the ncu_<kernel>_<tokens>_sass.csv.gz files that `PROFILE_SOURCE=1 scripts/gpu_round.sh
profile` writes (ncu --page source --csv --print-source sass) and prints, per profiled kernel,
the share of warp-state samples in each stall reason and the opcodes that collect the most.
With --loop, also the hottest loop body: the SASS lines executed as often as the most executed
one (within 1 %), in address order, with their samples, and their count: the instructions a
warp issues per trip of that loop (e.g. per K-chunk of a GEMM), the budget to compare against
what the trip must do.

  tools/ncu_stalls.py FILE.csv.gz [FILE.csv.gz ...] [--top N] [--loop]
"""
import argparse
import collections
import csv
import gzip
import re


def kernels(path):
    """Yields (kernel name, header, rows) per kernel section of the export, each name once."""
    seen = set()
    name, header, rows = None, None, []
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", newline="") as f:
        for row in csv.reader(f):
            if not row:
                continue
            if row[0] == "Kernel Name":
                if name is not None and name not in seen and header:
                    seen.add(name)
                    yield name, header, rows
                name, header, rows = row[1], None, []
            elif row[0] == "Address":
                header = row
            elif header is not None:
                rows.append(row)
    if name is not None and name not in seen and header:
        yield name, header, rows


def summarize(name, header, rows, top):
    col = {n: i for i, n in enumerate(header)}
    reasons = [n for n in header if n.startswith("stall_") and "(Not Issued)" not in n]
    total = collections.Counter()
    by_op = collections.defaultdict(collections.Counter)
    samples = 0
    for row in rows:
        op = re.sub(r"^@!?U?P\w+\s+", "", row[col["Source"]].strip()).split(" ")[0]
        samples += int(row[col["# Samples"]] or 0)
        for r in reasons:
            v = int(row[col[r]] or 0)
            if v:
                total[r] += v
                by_op[op][r] += v
    m = re.search(r"<(.*)>\(", name)
    print(f"== {m.group(1) if m else name}: {samples} samples")
    if samples == 0:
        return
    for r, v in total.most_common(top):
        print(f"   {r[6:]:<20} {100 * v / samples:5.1f} %")
    for op, c in sorted(by_op.items(), key=lambda kv: -sum(kv[1].values()))[:top]:
        s = sum(c.values())
        parts = ", ".join(f"{r[6:]} {100 * v / samples:.1f}" for r, v in c.most_common(3))
        print(f"     {op:<22} {100 * s / samples:5.1f} %  ({parts})")


def hottest_loop(header, rows):
    """The SASS lines executed within 1 % as often as the most executed one, in address order:
    (executed count, [(source, samples), ...])."""
    col = {n: i for i, n in enumerate(header)}
    executed = [int(r[col["Instructions Executed"]] or 0) for r in rows]
    top = max(executed, default=0)
    if top == 0:
        return 0, []
    body = [(r[col["Source"]].strip(), int(r[col["# Samples"]] or 0))
            for r, n in zip(rows, executed) if n >= 0.99 * top]
    return top, body


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--top", type=int, default=10)
    ap.add_argument("--loop", action="store_true", help="print the hottest loop body")
    a = ap.parse_args()
    for path in a.files:
        print(f"# {path}")
        for name, header, rows in kernels(path):
            summarize(name, header, rows, a.top)
            if a.loop:
                trips, body = hottest_loop(header, rows)
                print(f"   hottest loop: {len(body)} instructions per trip, {trips} warp-trips")
                for source, samples in body:
                    print(f"     {samples:>7}  {source}")


if __name__ == "__main__":
    main()
