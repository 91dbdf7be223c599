#!/usr/bin/env python3
"""bench/compare.sh's report: medians over rounds, markdown tables with the targets, a gnuplot chart.

    compare_report.py --raw collectives.raw.csv --meta collectives.meta --out build/release/bench/collectives

reads the raw rows (round,lib,op,ranks,bytes,usec,algbw_GBps,busbw_GBps, as nodal-bench and its
peers print them, with the round in front) and writes OUT.csv (medians, nodal-bench's columns),
OUT.md and OUT.gp (a gnuplot script that draws OUT.png). Standard library only.

A median is taken over the rounds of each (lib, op, ranks, bytes) for usec; algbw and busbw are then
that row's bandwidths at the median time (bytes over time is fixed per row, so they stay consistent
with usec), which keeps the bandwidth definitions in one place: bench/collective_bench.hpp.
"""

import argparse
import csv
import statistics
from collections import defaultdict

KNOWN_LIBS = ["nodal", "nodal-arena", "openmpi", "mpich", "gloo"]
NODAL_LIBS = ["nodal", "nodal-arena"]
MPI_LIBS = ["openmpi", "mpich"]
LIB_TITLES = {"openmpi": "Open MPI", "mpich": "MPICH", "gloo": "Gloo"}
COLORS = {"nodal": "#1f3d99", "nodal-arena": "#4aa3df", "openmpi": "#e07b00", "mpich": "#2e9e44", "gloo": "#808080"}


class Median:
    """The median row of one (lib, op, ranks, bytes) over the rounds."""

    def __init__(self, rows):
        self.rounds = len(rows)
        self.usec = statistics.median(r["usec"] for r in rows)
        # algbw * usec and busbw * usec are the same in every round (bytes and factors are fixed).
        alg_bytes = statistics.median(r["algbw"] * r["usec"] for r in rows)
        bus_bytes = statistics.median(r["busbw"] * r["usec"] for r in rows)
        self.algbw = alg_bytes / self.usec if self.usec > 0 else 0.0
        self.busbw = bus_bytes / self.usec if self.usec > 0 else 0.0


def read_raw(path):
    groups = defaultdict(list)
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            key = (row["lib"], row["op"], int(row["ranks"]), int(row["bytes"]))
            groups[key].append(
                {"usec": float(row["usec"]), "algbw": float(row["algbw_GBps"]), "busbw": float(row["busbw_GBps"])}
            )
    return {key: Median(rows) for key, rows in groups.items()}


def ordered(values, known):
    values = set(values)
    return [v for v in known if v in values] + sorted(values - set(known))


def size_name(n):
    if n == 0:
        return "-"
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def fmt_us(x):
    if x < 10:
        return f"{x:.2f}"
    if x < 1000:
        return f"{x:.1f}"
    return f"{x:.0f}"


def fmt_bw(x):
    if x <= 0:
        return "-"
    if x >= 100:
        return f"{x:.0f}"
    if x >= 10:
        return f"{x:.1f}"
    if x >= 0.01:
        return f"{x:.2f}"
    return f"{x:.1e}"


def speedup(peer, mine):
    """Peer's time over ours: 2.00x means nodal takes half the time."""
    if peer is None or mine is None or mine.usec <= 0:
        return "-"
    return f"{peer.usec / mine.usec:.2f}x"


def write_csv(medians, path):
    with open(path, "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["lib", "op", "ranks", "bytes", "usec", "algbw_GBps", "busbw_GBps"])
        for (lib, op, ranks, nbytes), m in sorted(medians.items(), key=lambda kv: sort_key(kv[0])):
            w.writerow([lib, op, ranks, nbytes, f"{m.usec:.3f}", f"{m.algbw:.6g}", f"{m.busbw:.6g}"])


def sort_key(key):
    lib, op, ranks, nbytes = key
    lib_rank = KNOWN_LIBS.index(lib) if lib in KNOWN_LIBS else len(KNOWN_LIBS)
    return (op, ranks, lib_rank, lib, nbytes)


def targets(medians):
    """The issue's targets, as (what, measured, status) rows."""

    def get(lib, op, ranks, nbytes):
        return medians.get((lib, op, ranks, nbytes))

    rows = []

    def latency(ranks, nbytes):
        what = f"allreduce, {ranks} ranks, {size_name(nbytes)}: nodal <= 1/2 of Open MPI's time"
        mine, peer = get("nodal", "allreduce", ranks, nbytes), get("openmpi", "allreduce", ranks, nbytes)
        if not mine or not peer:
            rows.append((what, "not measured", "n/a"))
            return
        measured = f"nodal {fmt_us(mine.usec)} us, Open MPI {fmt_us(peer.usec)} us ({speedup(peer, mine)})"
        rows.append((what, measured, "met" if mine.usec <= peer.usec / 2 else "NOT met"))

    def bandwidth(lib, nbytes, floor=None, times_openmpi=None):
        if floor is not None:
            what = f"allreduce, 2 ranks, {size_name(nbytes)}: {lib} algbw >= {floor:g} GB/s"
        else:
            what = f"allreduce, 2 ranks, {size_name(nbytes)}: {lib} algbw >= {times_openmpi:g}x Open MPI's"
        mine, peer = get(lib, "allreduce", 2, nbytes), get("openmpi", "allreduce", 2, nbytes)
        if not mine or (times_openmpi is not None and not peer):
            rows.append((what, "not measured", "n/a"))
            return
        if floor is not None:
            ok = mine.algbw >= floor
            measured = f"{lib} {fmt_bw(mine.algbw)} GB/s"
        else:
            ok = mine.algbw >= times_openmpi * peer.algbw
            measured = f"{lib} {fmt_bw(mine.algbw)} GB/s, Open MPI {fmt_bw(peer.algbw)} GB/s ({speedup(peer, mine)})"
        rows.append((what, measured, "met" if ok else "NOT met"))

    latency(2, 4)
    latency(2, 1024)
    bandwidth("nodal", 64 << 20, floor=6.5)
    bandwidth("nodal-arena", 64 << 20, floor=10)
    latency(4, 4)

    for op in ("allreduce", "broadcast", "allgather", "reduce_scatter", "alltoall", "reduce", "gather", "scatter"):
        what = f"{op}: nodal ahead of Open MPI and MPICH at every size"
        behind, compared, worst = [], 0, None
        for (lib, o, ranks, nbytes), mine in medians.items():
            if lib != "nodal" or o != op:
                continue
            for peer_lib in MPI_LIBS:
                peer = get(peer_lib, op, ranks, nbytes)
                if not peer:
                    continue
                compared += 1
                ratio = peer.usec / mine.usec if mine.usec > 0 else float("inf")
                if worst is None or ratio < worst[0]:
                    worst = (ratio, peer_lib, ranks, nbytes)
                if mine.usec >= peer.usec:
                    behind.append(f"{size_name(nbytes)} x{ranks} vs {LIB_TITLES[peer_lib]}")
        if compared == 0:
            rows.append((what, "not measured", "n/a"))
            continue
        ratio, peer_lib, ranks, nbytes = worst
        measured = f"closest: {ratio:.2f}x vs {LIB_TITLES[peer_lib]} at {size_name(nbytes)}, {ranks} ranks"
        if behind:
            shown = ", ".join(behind[:8]) + (f" and {len(behind) - 8} more" if len(behind) > 8 else "")
            measured += f"; behind at {shown}"
        rows.append((what, measured, "NOT met" if behind else "met"))
    return rows


def write_md(medians, meta_lines, path):
    libs = ordered({k[0] for k in medians}, KNOWN_LIBS)
    ops = ordered({k[1] for k in medians}, ["allreduce", "broadcast", "allgather", "reduce_scatter", "alltoall",
                                            "reduce", "gather", "scatter", "barrier"])
    rounds = max((m.rounds for m in medians.values()), default=0)
    out = ["# Collectives: nodal, Open MPI, MPICH, Gloo side by side", ""]
    out += [f"- {line}" for line in meta_lines]
    out += [
        "",
        f"usec: microseconds per call, the median over rounds (up to {rounds}) of each round's figure, which is",
        "the max over ranks of each rank's time per call (bench/collective_bench.hpp). GB/s: algbw (1e9",
        "bytes/s) as nccl-tests defines it. bytes: per-rank message size (OSU). `openmpi/nodal` is Open MPI's",
        "time over nodal's: 2.00x means nodal takes half the time. All libraries ran interleaved in the",
        "same minutes, on the same machine.",
        "",
        "## Targets",
        "",
        "| target | measured | status |",
        "|---|---|---|",
    ]
    out += [f"| {what} | {measured} | {status} |" for what, measured, status in targets(medians)]

    for op in ops:
        for ranks in sorted({k[2] for k in medians if k[1] == op}):
            present = [lib for lib in libs if any(k[0] == lib and k[1] == op and k[2] == ranks for k in medians)]
            sizes = sorted({k[3] for k in medians if k[1] == op and k[2] == ranks})
            pairs = [(p, n) for n in NODAL_LIBS if n in present for p in MPI_LIBS if p in present]
            header = ["bytes"] + [f"{lib} us" for lib in present]
            if op != "barrier":
                header += [f"{lib} GB/s" for lib in present]
            header += [f"{p}/{n}" for p, n in pairs]
            out += ["", f"## {op}, {ranks} ranks", "", "| " + " | ".join(header) + " |",
                    "|" + "---|" * len(header)]
            for nbytes in sizes:
                row = [size_name(nbytes)]
                cells = [medians.get((lib, op, ranks, nbytes)) for lib in present]
                row += [fmt_us(m.usec) if m else "-" for m in cells]
                if op != "barrier":
                    row += [fmt_bw(m.algbw) if m else "-" for m in cells]
                row += [speedup(medians.get((p, op, ranks, nbytes)), medians.get((n, op, ranks, nbytes)))
                        for p, n in pairs]
                out.append("| " + " | ".join(row) + " |")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def write_gnuplot(medians, png_path, path):
    libs = ordered({k[0] for k in medians}, KNOWN_LIBS)
    panels = sorted({(k[1], k[2]) for k in medians if k[1] != "barrier"},
                    key=lambda p: (["allreduce", "broadcast", "allgather"].index(p[0])
                                   if p[0] in ("allreduce", "broadcast", "allgather") else 9, p[0], p[1]))
    ops = list(dict.fromkeys(op for op, _ in panels))
    rank_counts = sorted({ranks for _, ranks in panels})
    lines = []
    blocks = {}
    for op, ranks in panels:
        for lib in libs:
            points = sorted((k[3], m.algbw) for k, m in medians.items()
                            if k[0] == lib and k[1] == op and k[2] == ranks and m.algbw > 0)
            if not points:
                continue
            name = f"$d{len(blocks)}"
            blocks[(op, ranks, lib)] = name
            lines.append(f"{name} << EOD")
            lines += [f"{b} {bw:.6g}" for b, bw in points]
            lines.append("EOD")
    sizes = [k[3] for k in medians if k[3] > 0]
    cols, rows = max(len(ops), 1), max(len(rank_counts), 1)
    lines += [
        f"set terminal pngcairo size {560 * cols},{420 * rows} font ',10'",
        f"set output '{png_path}'",
        "set multiplot layout %d,%d title 'algbw (GB/s) against per-rank message size, median over rounds'"
        % (rows, cols),
        "set logscale x 2",
        # A margin either side, so that the first and last sizes get their tics.
        f"set xrange [{min(sizes, default=1) / 1.5:g}:{max(sizes, default=2) * 1.5:g}]",
        "set logscale y 10",
        "set format y '%g'",
        "set xtics ('4' 4, '64' 64, '1K' 1024, '16K' 16384, '256K' 262144, '4M' 4194304, '64M' 67108864)",
        "set grid",
        "set key bottom right font ',9'",  # bandwidth grows with size: that corner stays empty
        "set xlabel 'bytes per rank'",
        "set ylabel 'algbw (GB/s)'",
    ]
    for ranks in rank_counts:
        for op in ops:
            curves = [(lib, blocks[(op, ranks, lib)]) for lib in libs if (op, ranks, lib) in blocks]
            if not curves:
                lines.append("set multiplot next")
                continue
            lines.append(f"set title '{op}, {ranks} ranks'")
            plots = [f"{name} using 1:2 with linespoints pt 7 ps 0.5 lw 2 lc rgb '{COLORS.get(lib, '#000000')}' "
                     f"title '{lib}'" for lib, name in curves]
            lines.append("plot " + ", \\\n     ".join(plots))
    lines.append("unset multiplot")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--raw", required=True, help="rows with the round in front (compare.sh's raw CSV)")
    parser.add_argument("--meta", help="lines 'key: value' about the run, listed at the top of the markdown")
    parser.add_argument("--out", required=True, help="output prefix: writes OUT.csv, OUT.md, OUT.gp (draws OUT.png)")
    args = parser.parse_args()
    medians = read_raw(args.raw)
    meta_lines = []
    if args.meta:
        with open(args.meta) as f:
            meta_lines = [line.rstrip("\n") for line in f if line.strip()]
    write_csv(medians, args.out + ".csv")
    write_md(medians, meta_lines, args.out + ".md")
    write_gnuplot(medians, args.out + ".png", args.out + ".gp")


if __name__ == "__main__":
    main()
