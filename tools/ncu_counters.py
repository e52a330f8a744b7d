#!/usr/bin/env python3
"""One line per profiled kernel of Nsight Compute `--csv` metric exports
(tools/ncu_evict_probe.sh): time, DRAM bytes read, L2 hit rate, L2 read bytes and read hits,
L2 write bytes."""
import csv
import re
import sys


def megabytes(metrics, key, unit=1.0):
    return metrics.get(key, 0.0) * unit / 1e6


def main(paths):
    for path in paths:
        kernels = {}
        with open(path, newline="") as f:
            for row in csv.reader(f):
                if len(row) < 15 or not row[0].isdigit():
                    continue
                name = re.sub(r"\(.*", "", row[4]).replace("void ", "")
                name = name.replace("moe_ep::kern::", "")
                k = kernels.setdefault(row[0], {"name": name})
                try:
                    k[row[-3]] = float(row[-1].replace(",", ""))
                except ValueError:
                    pass
        print("==", path.rsplit("/", 1)[-1])
        for kid, m in kernels.items():
            print(f"  {kid:>3} {m['name'][:48]:48s} {m.get('gpu__time_duration.sum', 0) / 1e3:8.1f} us"
                  f"  DRAM read {megabytes(m, 'dram__bytes_read.sum'):8.1f} MB"
                  f"  L2 hit {m.get('lts__t_sector_hit_rate.pct', 0):5.1f} %"
                  f"  L2 read {megabytes(m, 'lts__t_sectors_op_read.sum', 32):8.1f} MB"
                  f" (hits {megabytes(m, 'lts__t_sectors_op_read_lookup_hit.sum', 32):7.1f})"
                  f"  L2 write {megabytes(m, 'lts__t_sectors_op_write.sum', 32):6.1f} MB")


if __name__ == "__main__":
    main(sys.argv[1:])
