"""Markdown table of bench_layer records: the median forward time (us) per token count and recipe
for one routing, each with the kernel its launch plan chose (fc1's family and the routing tile),
beside the floors of the case: the weight bytes of the 4-bit recipe that reads the fewest at the
HBM copy ceiling, and its FLOPs at the dense bf16 MMA peak (docs/benchmarks.md).

    python3 bench/report.py RECORDS.json[,MORE.json] [--routing uniform|zipf] [--recipes a,b]

e.g. `python3 bench/report.py bench/results/h200-ep1-dsv3.json`.
"""
import argparse
import json
import re

HBM_BYTES_PER_S = 4.22e12  # the H200's measured copy ceiling (docs/benchmarks.md)
BF16_FLOPS_PER_S = 755e12  # dense bf16 matmul, measured


def kernel_of(plan):
    """fc1's kernel family and the routing tile of a record's plan string, e.g. 'decode/8', or
    'wgmma_m64+narrow/160' where the plan splits the tiles of 160 by rows (m64_split)."""
    tile = re.search(r"\btile=(\d+)", plan)
    fc1 = re.search(r"\bfc1=([a-z0-9_]+)(\[[^]]*\])?", plan)
    if not tile or not fc1:
        return "?"
    narrow = "+narrow" if fc1.group(2) and "narrow_ctas=" in fc1.group(2) else ""
    return f"{fc1.group(1)}{narrow}/{tile.group(1)}"


def floors_us(records):
    """(HBM floor, bf16 MMA floor) in us of one case: the fewest weight bytes of its 4-bit records
    over the copy ceiling, and their FLOPs (tflops x median) over the bf16 peak."""
    four_bit = [r for r in records if r["recipe"] != "bf16"] or records
    r = min(four_bit, key=lambda r: r["weight_bytes_read"])
    flops = r["tflops"] * 1e12 * r["median_us"] * 1e-6
    return r["weight_bytes_read"] / HBM_BYTES_PER_S * 1e6, flops / BF16_FLOPS_PER_S * 1e6


def table(records, routing="uniform", recipes=None):
    """The markdown table's lines for `records` (a list of bench_layer records of one shape)."""
    rows = [r for r in records if r["routing"] == routing]
    if not rows:
        raise ValueError(f"no records with routing '{routing}'")
    shapes = {(r["shape"], r["H"], r["I"], r["E"], r["K"]) for r in rows}
    if len(shapes) != 1:
        raise ValueError(f"records of several shapes: {sorted(shapes)}")
    shape, H, I, E, K = shapes.pop()
    present = sorted({r["recipe"] for r in rows})
    recipes = recipes or present
    missing = [x for x in recipes if x not in present]
    if missing:
        raise ValueError(f"no records of recipe(s) {missing} (present: {present})")
    by_case = {(r["tokens_per_rank"], r["recipe"]): r for r in rows}
    tokens = sorted({r["tokens_per_rank"] for r in rows})
    out = [f"{shape} (H {H}, I {I}, E {E}, K {K}), {routing} routing, median us "
           "(fc1 kernel / tile):", "",
           "| tokens | rows/expert | " + " | ".join(recipes) + " | HBM floor | bf16 MMA floor |",
           "|---" * (len(recipes) + 4) + "|"]
    for t in tokens:
        case = [by_case[(t, x)] for x in recipes if (t, x) in by_case]
        cells = []
        for x in recipes:
            r = by_case.get((t, x))
            cells.append("—" if r is None else f"{r['median_us']:.1f} ({kernel_of(r['plan'])})")
        hbm, mma = floors_us(case)
        out.append(f"| {t} | {t * K / E:.2f} | " + " | ".join(cells) +
                   f" | {hbm:.1f} | {mma:.1f} |")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("records", help="bench_layer JSON file(s), joined with commas")
    ap.add_argument("--routing", default="uniform", choices=["uniform", "zipf"])
    ap.add_argument("--recipes", default="", help="columns, comma-separated (default: all)")
    a = ap.parse_args()
    records = [r for p in a.records.split(",") for r in json.load(open(p))]
    recipes = [x for x in a.recipes.split(",") if x]
    print("\n".join(table(records, a.routing, recipes or None)))


if __name__ == "__main__":
    main()
