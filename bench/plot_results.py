"""Plot of bench_layer JSON (and the torch baseline): median time vs tokens per rank for each
recipe, uniform routing, with the weight-read floor (bytes / 4.22 TB/s) of nvfp4 drawn in.

    python3 bench/plot_results.py ours.json [torch.json] out.png
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    # Several JSON files of ours may be joined with commas (e.g. one per recipe at EP > 1).
    ours = [r for p in sys.argv[1].split(",") for r in json.load(open(p))]
    torch_path = sys.argv[2] if len(sys.argv) > 3 else None
    out = sys.argv[-1]
    fig, ax = plt.subplots(figsize=(8, 5))
    recipes = sorted({r["recipe"] for r in ours})
    for rec in recipes:
        rows = sorted((r for r in ours if r["recipe"] == rec and r["routing"] == "uniform"),
                      key=lambda r: r["tokens_per_rank"])
        ax.plot([r["tokens_per_rank"] for r in rows], [r["median_us"] for r in rows], "o-",
                label=f"moe_ep {rec}")
        if rec == "nvfp4":
            ax.plot([r["tokens_per_rank"] for r in rows],
                    [r["weight_bytes_read"] / 4.22e12 * 1e6 for r in rows], "k--",
                    label="nvfp4 weight-read floor (4.22 TB/s)")
    if torch_path:
        base = sorted((r for r in json.load(open(torch_path)) if r["routing"] == "uniform"),
                      key=lambda r: r["tokens_per_rank"])
        ax.plot([r["tokens_per_rank"] for r in base], [r["median_us"] for r in base], "s:",
                color="gray", label=base[0].get("label", "PyTorch bf16 (_grouped_mm)"))
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(f"tokens per rank (EP = {ours[0].get('ep', 1)})")
    ax.set_ylabel("median forward time (us)")
    ax.set_title(f"{ours[0]['shape']} MoE layer (H {ours[0]['H']}, I {ours[0]['I']}, "
                 f"E {ours[0]['E']}, K {ours[0]['K']}) on {ours[0]['device']}, uniform routing")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main()
