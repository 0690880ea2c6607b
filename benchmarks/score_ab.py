"""A/B of two versions of the score kernel, side by side in one run (one layer, bs=1).

    git show REV:kernels/score_pages.py > /tmp/score_pages_base.py
    python benchmarks/score_ab.py --baseline /tmp/score_pages_base.py --out score_ab.json

"base" is the given module file (its relative imports are resolved against
sglang_locks.kernels), "head" the installed sglang_locks.kernels.score_pages.
Each launch option set runs on both, alternating, on the same random
int8-int4-int8 summaries: CUDA-event medians of CUDA graphs of 20 launches,
and the largest score difference against the base's default launch.
"""

import argparse
import datetime
import importlib.util
import json
import os
import sys

import torch

import sglang_locks.kernels.score_pages as head
from attention_decode import ONE_LAYER_CONTEXTS, copy_bandwidth_gbs, launch_us, one_layer_inputs


def load_baseline(path: str):
    spec = importlib.util.spec_from_file_location("sglang_locks.kernels._score_pages_base", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--baseline", required=True, help="a score_pages.py of another revision")
    ap.add_argument("--out", required=True)
    ap.add_argument("--options", default="2:ptx,2:int8,4:int8,4:ptx", help="NUM_WARPS:INT_CONVERSION,...")
    args = ap.parse_args()
    base = load_baseline(args.baseline)
    copy_gbs = copy_bandwidth_gbs()
    rows = []
    for shape in ONE_LAYER_CONTEXTS:
        call, moved = one_layer_inputs(shape)
        ref = base.score_pages_triton(*call, int_conversion="ptx")[0]
        for opt in args.options.split(","):
            warps, conversion = opt.split(":")
            opts = dict(num_warps=int(warps), int_conversion=conversion)
            for name, module in (("base", base), ("head", head)):
                us = launch_us(lambda: module.score_pages_triton(*call, **opts))
                diff = (module.score_pages_triton(*call, **opts)[0] - ref).abs().max().item()
                rows.append({"shape": shape, "version": name, **opts, "us": us,
                             "copy_fraction": moved / us / 1e3 / copy_gbs, "max_abs_diff_vs_base_ptx": diff})
                print(rows[-1], flush=True)
        with open(args.out, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "git": os.environ.get("GIT_REV", ""),
                       "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                       "baseline": args.baseline, "command": " ".join(["python"] + sys.argv), "copy_gbs": copy_gbs, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
