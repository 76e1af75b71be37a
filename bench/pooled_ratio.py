#!/usr/bin/env python3
"""One ratio over several runs of bench/python_alloc.py: each file's median of the per-round
ratios, then all rounds pooled, with the share of rounds meeting a target and a bootstrap 95%
interval of the pooled median. For a target near the run-to-run noise, where one run's median
alone says little.

    python bench/pooled_ratio.py numba/rmm numba/kmm OUT1/python_alloc.json OUT2/numba_interleaved.json ... [--target 2]

The files are the JSON that bench/python_alloc.py wrote in each run (working files, e.g. the
$OUT folders of tools/gpu/run_python.sh); the pooled figure goes into bench/results/python_alloc.md.
"""

import argparse
import json
import os
import random
import statistics


def round_ratios(path, numerator, denominator):
    results = json.load(open(path))["results"]
    return [a / b for a, b in zip(results[numerator]["samples"], results[denominator]["samples"])]


def bootstrap_interval(values, draws=5000, seed=1):
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(draws))
    return medians[int(0.025 * draws)], medians[int(0.975 * draws) - 1]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("numerator")
    p.add_argument("denominator")
    p.add_argument("files", nargs="+")
    p.add_argument("--target", type=float, default=2.0)
    args = p.parse_args()
    pooled = []
    for path in args.files:
        ratios = round_ratios(path, args.numerator, args.denominator)
        pooled += ratios
        print("%-64s median %.2f over %d rounds" % (os.path.basename(path), statistics.median(ratios), len(ratios)))
    low, high = bootstrap_interval(pooled)
    meeting = sum(r >= args.target for r in pooled)
    print("pooled: median %.2f over %d rounds, 95%% interval [%.2f, %.2f]; %d%% of rounds >= %g"
          % (statistics.median(pooled), len(pooled), low, high, round(100 * meeting / len(pooled)), args.target))


if __name__ == "__main__":
    main()
