#!/usr/bin/env python3
"""(d) against the pooled net-0 pair (c) and (e), with 90 % bootstrap intervals.

Reads a cozyplane-bench report (stdout of `cozyplane-bench --only c,d,e ...`) and, per
metric, prints:
  d/pooled   median of (d) / median of (c) and (e) together, with its 90 % interval
             over 2000 resamples of the rounds (seeded, so a report always gives the
             same figures);
  A/A e/c    the same for (e) against (c): what the method makes of two identical
             datapaths.
Usage: pooled.py REPORT.md
"""
import random
import re
import statistics as st
import sys


def rounds_of(report):
    sec = report[report.index("Per round:"):]
    header = next(l for l in sec.splitlines() if l.startswith("| round"))
    cols = [c.strip() for c in header.strip().strip("|").split("|")]
    data = {}
    for line in sec.splitlines():
        if not re.match(r"\| \d+ \| [a-e] \|", line):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        rnd, variant = int(cells[0]), cells[1]
        for col, cell in zip(cols[2:], cells[2:]):
            try:
                value = float(cell.split(" ")[0].split("/")[0])
            except ValueError:
                continue
            data.setdefault(col, {}).setdefault(rnd, {})[variant] = value
    return data


def estimates(sample):
    d = st.median(x["d"] for x in sample)
    pooled = st.median([x["c"] for x in sample] + [x["e"] for x in sample])
    aa = st.median(x["e"] for x in sample) / st.median(x["c"] for x in sample)
    return d / pooled, aa


def main():
    data = rounds_of(open(sys.argv[1]).read())
    rng = random.Random(1)
    for metric, by_round in data.items():
        rows = [v for _, v in sorted(by_round.items()) if all(k in v for k in "cde")]
        if len(rows) < 2:
            continue
        point = estimates(rows)
        boots = [estimates([rng.choice(rows) for _ in rows]) for _ in range(2000)]

        def interval(i):
            v = sorted(b[i] for b in boots)
            return v[len(v) * 5 // 100], v[len(v) * 95 // 100]

        (dl, dh), (al, ah) = interval(0), interval(1)
        print(f"{metric}: rounds {len(rows)}; d/pooled {point[0]:.3f} ({dl:.3f}-{dh:.3f}); "
              f"A/A e/c {point[1]:.3f} ({al:.3f}-{ah:.3f})")


if __name__ == "__main__":
    main()
