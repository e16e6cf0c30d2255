"""Benchmark: a ten-minute window of a one-week 2024-format trace, three ways.

    python benchmarks/trace_window.py [--dir /tmp/ff-bench] [--pandas-rows 2000000]

1. Generates (once, outside the repo) a synthetic file shaped like
   AzureLLMInferenceTrace_conv_1week.csv: 27,303,995 rows, timestamps in the 2024 form
   with and without a fraction mixed, log-normal token counts near the real medians.
2. Measures, each in a fresh process (wall time and peak RSS from /usr/bin/time -v):
   `filledfirst trace subsample` (bisect), `filledfirst trace stats` (full streaming
   scan) and the Azure notebook's way (pandas read_csv with date_format="mixed", then a
   filter). pandas reads `--pandas-rows` rows (0 = all) and is extrapolated linearly
   to the whole file when that is a prefix; the table says so.
3. Prints a markdown table (paste it into benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import platform
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import polars as pl

ROWS = 27_303_995
WEEK_US = 7 * 86_400 * 1_000_000
DAY0 = np.datetime64("2024-05-12T00:00:00", "us")
CHUNK = 1_000_000
HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
WINDOW_OFFSET_S = 3 * 86_400 + 13 * 3600  # a Wednesday afternoon: deep inside the file
FILLEDFIRST = [sys.executable, "-m", "filledfirst"]


def generate(path: Path, rows: int = ROWS, seed: int = 0) -> None:
    """Sorted arrival times with a day/night swing; about one in ten on a whole second
    (written without a fraction, as the real file does for those)."""
    rng = np.random.default_rng(seed)
    # Inverse-CDF of a rate 1 + 0.6 sin(2 pi t / day), sampled on a fine grid.
    grid = np.linspace(0, WEEK_US, 1_000_001)
    rate = 1 + 0.6 * np.sin(2 * np.pi * grid / 86_400e6)
    cdf = np.concatenate([[0], np.cumsum((rate[1:] + rate[:-1]) / 2)])
    cdf /= cdf[-1]
    u = np.sort(rng.random(rows))
    t_us = np.interp(u, cdf, grid).astype(np.int64)
    whole = rng.random(rows) < 0.1
    t_us[whole] -= t_us[whole] % 1_000_000
    t_us.sort()
    prompt = np.clip(rng.lognormal(np.log(1020), 0.76, rows), 1, 30_000).astype(np.int64)
    output = np.clip(rng.lognormal(np.log(129), 1.0, rows), 0, 4_000).astype(np.int64)
    tmp = path.with_name(path.name + ".part")
    with tmp.open("w") as fh:
        fh.write(HEADER)
        for lo in range(0, rows, CHUNK):
            hi = min(lo + CHUNK, rows)
            ts = pl.Series((DAY0 + t_us[lo:hi].astype("timedelta64[us]")))
            text = pl.select(
                pl.when(ts.dt.microsecond() == 0)
                .then(ts.dt.strftime("%Y-%m-%d %H:%M:%S+00:00"))
                .otherwise(ts.dt.strftime("%Y-%m-%d %H:%M:%S%.6f+00:00"))
            ).to_series()
            pl.DataFrame({"t": text, "p": prompt[lo:hi], "o": output[lo:hi]}).write_csv(fh, include_header=False)
    tmp.rename(path)


def measure(argv: list[str], repeat: int = 1) -> dict:
    """Median wall seconds and largest peak RSS (MB) over `repeat` fresh processes."""
    walls, rss = [], []
    for _ in range(repeat):
        t0 = time.perf_counter()
        done = subprocess.run(["/usr/bin/time", "-v", *argv], capture_output=True, text=True)
        walls.append(time.perf_counter() - t0)
        if done.returncode != 0:
            raise SystemExit(f"failed: {' '.join(argv)}\n{done.stderr[-3000:]}")
        rss.append(int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr)[1]) / 1024)
    return {"wall_s": statistics.median(walls), "rss_mb": max(rss), "stdout": done.stdout, "walls": walls}


_PANDAS = """
import sys, pandas as pd
path, nrows, start_s, minutes = sys.argv[1], int(sys.argv[2]) or None, float(sys.argv[3]), float(sys.argv[4])
df = pd.read_csv(path, parse_dates=["TIMESTAMP"], date_format="mixed", nrows=nrows)
start = df["TIMESTAMP"].iloc[0] + pd.Timedelta(seconds=start_s)
w = df[(df["TIMESTAMP"] >= start) & (df["TIMESTAMP"] < start + pd.Timedelta(minutes=minutes))]
print(len(df), len(w), len(w.iloc[::10]))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/ff-bench"))
    ap.add_argument("--pandas-rows", type=int, default=2_000_000, help="0 = the whole file")
    ap.add_argument("--repeat", type=int, default=3, help="runs of ours (median time); pandas runs once")
    args = ap.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    big = args.dir / "AzureLLMInferenceTrace_conv_1week_synthetic.csv"
    if not big.exists():
        t0 = time.perf_counter()
        generate(big)
        print(f"generated {big} in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    size_gb = big.stat().st_size / 1e9

    window = measure([*FILLEDFIRST, "trace", "subsample", str(big), "--start-offset", str(WINDOW_OFFSET_S),
                      "--minutes", "10", "--keep-every", "10", "--out", str(args.dir / "window.parquet")],
                     args.repeat)
    kept = pl.read_parquet(args.dir / "window.parquet").height
    stats = measure([*FILLEDFIRST, "trace", "stats", str(big), "--out", str(args.dir / "stats.json")], args.repeat)
    # On a prefix the window (61 h in) holds no rows; the cost is the read and the date
    # parse, which grow linearly with the rows read, so the prefix time scales up.
    pandas = measure([sys.executable, "-c", _PANDAS, str(big), str(args.pandas_rows),
                      str(WINDOW_OFFSET_S), "10"])
    read_rows = int(pandas["stdout"].split()[0])
    scale = ROWS / read_rows
    pandas_full = {"wall_s": pandas["wall_s"] * scale, "rss_mb": pandas["rss_mb"] * scale}

    cpu = platform.processor() or platform.machine()
    print(f"file: {big} ({size_gb:.2f} GB, {ROWS:,} rows); window: 10 min at +{WINDOW_OFFSET_S} s, "
          f"every 10th ({kept} kept); machine: {cpu}, {subprocess.getoutput('nproc')} cores; "
          f"python {platform.python_version()}, polars {pl.__version__}\n")
    print(f"ours: median of {args.repeat} runs (all: window "
          f"{', '.join(f'{w:.2f}' for w in window['walls'])} s; "
          f"stats {', '.join(f'{w:.1f}' for w in stats['walls'])} s)\n")
    print("| what | wall time | peak RSS |")
    print("|---|---:|---:|")
    print(f"| `trace subsample` (bisect, 10-minute window) | {window['wall_s']:.2f} s | {window['rss_mb']:.0f} MB |")
    print(f"| `trace stats` (streaming full scan) | {stats['wall_s']:.1f} s | {stats['rss_mb']:.0f} MB |")
    if scale > 1:
        print(f"| pandas `read_csv(date_format=\"mixed\")` + filter, measured on the first {read_rows:,} rows "
              f"| {pandas['wall_s']:.1f} s | {pandas['rss_mb']:.0f} MB |")
        print(f"| same, extrapolated linearly x{scale:.2f} to the whole file (not measured) "
              f"| ~{pandas_full['wall_s']:.0f} s | ~{pandas_full['rss_mb']:.0f} MB |")
    else:
        print(f"| pandas `read_csv(date_format=\"mixed\")` + filter, whole file | {pandas['wall_s']:.1f} s "
              f"| {pandas['rss_mb']:.0f} MB |")
    print(f"\nratio pandas / bisect window: {pandas_full['wall_s'] / window['wall_s']:.0f}x time, "
          f"{pandas_full['rss_mb'] / window['rss_mb']:.0f}x memory")


if __name__ == "__main__":
    main()
