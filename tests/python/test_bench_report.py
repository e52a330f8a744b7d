"""bench/report.py: the records' table (times, chosen kernels, floors) and its refusals."""
import importlib.util
import pathlib

import pytest

_PATH = pathlib.Path(__file__).resolve().parents[2] / "bench" / "report.py"
_SPEC = importlib.util.spec_from_file_location("bench_report", _PATH)
report = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(report)


def record(recipe, tokens, median, wbytes, plan, routing="uniform", tflops=1.0):
    return {"shape": "tiny", "H": 64, "I": 32, "E": 4, "K": 2, "recipe": recipe,
            "tokens_per_rank": tokens, "routing": routing, "median_us": median,
            "weight_bytes_read": wbytes, "tflops": tflops, "plan": plan}


RECORDS = [
    record("nvfp4", 1, 10.0, 4.22e6, "cuda T=1 tile=8 prepare=q4x1/one_block fc1=decode[x]"),
    record("bf16", 1, 20.0, 16.88e6, "cuda T=1 tile=16 prepare=q4x1/one_block fc1=decode[x]"),
    record("nvfp4", 8, 30.0, 8.44e6, "cuda T=8 tile=160 fc1=wgmma_m64[x]", tflops=755.0),
    record("nvfp4", 8, 99.0, 8.44e6, "cuda T=8 tile=160 fc1=wgmma_m64[x]", routing="zipf"),
]


def test_table_rows_kernels_and_floors():
    lines = report.table(RECORDS)
    assert lines[0].startswith("tiny (H 64, I 32, E 4, K 2), uniform routing")
    assert lines[2] == "| tokens | rows/expert | bf16 | nvfp4 | HBM floor | bf16 MMA floor |"
    # 1 token: bf16 on decode tile 16, nvfp4 on decode tile 8; the HBM floor from nvfp4's bytes
    # (4.22 MB at 4.22 TB/s = 1 us), not bf16's.
    assert lines[4] == "| 1 | 0.50 | 20.0 (decode/16) | 10.0 (decode/8) | 1.0 | 0.0 |"
    # 8 tokens: no bf16 record; 755 TFLOP/s for 30 us is 30 us at the bf16 peak.
    assert lines[5] == "| 8 | 4.00 | — | 30.0 (wgmma_m64/160) | 2.0 | 30.0 |"
    assert len(lines) == 6


def test_routing_and_recipe_choice():
    lines = report.table(RECORDS, routing="zipf", recipes=["nvfp4"])
    assert lines[4] == "| 8 | 4.00 | 99.0 (wgmma_m64/160) | 2.0 | 0.1 |"
    assert len(lines) == 5


def test_refusals_name_the_problem():
    with pytest.raises(ValueError, match="routing 'zipf'"):
        report.table(RECORDS[:3], routing="zipf")
    with pytest.raises(ValueError, match=r"recipe\(s\) \['mxfp4_bf16'\]"):
        report.table(RECORDS, recipes=["mxfp4_bf16"])
    other = dict(RECORDS[0], shape="other")
    with pytest.raises(ValueError, match="several shapes"):
        report.table(RECORDS + [other])
    assert report.kernel_of("no plan here") == "?"
    split = ("cuda T=1024 tile=160 m64_split fc1=wgmma_m64[tiles=305 mtiles=32 ctas=4032 "
             "narrow_ctas=8192] fc2=wgmma_m64[tiles=305 mtiles=56 ctas=7056 narrow_ctas=14336]")
    assert report.kernel_of(split) == "wgmma_m64+narrow/160"
    assert report.kernel_of(split.replace(" narrow_ctas=8192", "")) == "wgmma_m64/160"
