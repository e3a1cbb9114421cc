#!/usr/bin/env python3
"""Two node processes over loopback against one process, at the seed's scale (issue 36).

Writes one TrainingJob of planted Netflix-shaped ratings (default 25 M: 119,473 users x 17,770
items, true rank 16, noise 0.1, learned rank 32, SGD rate 0.03, L2 0.02) with two reliable nodes
of one worker thread each and no transient tier, and trains it twice with `ebbflow run`:
- `--in-process`: both instances as threads of one process;
- node processes: one `ebbflow node` process per instance, the data plane over loopback (TLS).

Every node generates only its own shard. Reports, from one run of each:
- training time: each mode runs the job twice, `--short-clocks` and `--clocks` long, and the
  difference of their wall times is the time of the clocks between, so data generation and
  start-up are left out of both (node processes report their progress at segment ends only);
- ratings per second over those clocks, the ratio processes / in-process (target >= 0.7);
- test RMSE at the end (both must reach the bar);
- peak RSS (VmHWM, sampled every 0.2 s from /proc) of each node process and of the in-process
  run, against the target 1.5 x (its parameter partitions + its data shard) + 64 MiB.
With `--glibc-default` the node processes run a third time with glibc's default malloc (its
dynamic mmap threshold) instead of the fixed 128 KiB threshold `ebbflow run` gives them, and the
table shows what the setting does to each node's peak, to the clocks per second and to each
node's CPU time (user and system, where mapping and unmapping blocks would show).

Prints a Markdown table; exits non-zero if a run fails or misses the bar.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

MIB = 1 << 20


def vm_hwm(pid):
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def cpu_seconds(pid):
    """(user, system) CPU seconds of `pid` so far, from /proc/PID/stat."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def children(pid):
    """Direct children of `pid` (from /proc/*/stat)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(entry))
    return found


class PeakSampler(threading.Thread):
    """Samples the VmHWM of a process and of its `ebbflow node` children until stopped."""

    def __init__(self, pid):
        super().__init__(daemon=True)
        self.pid, self.peaks, self.stop = pid, {}, threading.Event()
        # CPU seconds (user, system) of each process at its last sample
        self.cpu = {}

    def run(self):
        while not self.stop.is_set():
            for pid in [self.pid] + children(self.pid):
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as cmd:
                        argv = cmd.read().split(b"\0")
                except OSError:
                    continue
                name = "run" if pid == self.pid else None
                if name is None and b"node" in argv and b"--name" in argv:
                    name = argv[argv.index(b"--name") + 1].decode()
                peak = vm_hwm(pid)
                if name and peak:
                    self.peaks[name] = max(self.peaks.get(name, 0), peak)
                    times = cpu_seconds(pid)
                    if times:
                        self.cpu[name] = times
            self.stop.wait(0.2)


def manifest(args, trace, clocks):
    consistency = ("    model: BSP" if args.staleness == 0 else
                   f"    model: SSP\n    staleness: {args.staleness}")
    return f"""apiVersion: ebbflow.dev/v1alpha1
kind: TrainingJob
metadata:
  name: mf-nodes-bench
spec:
  app:
    kind: MatrixFactorization
    dataset:
      synthetic:
        seed: {args.seed}
        users: {args.users}
        items: {args.items}
        ratings: {args.ratings}
        trueRank: 16
        noise: 0.1
    hyperparameters:
      rank: {args.rank}
      learningRate: 0.03
      regularization: 0.02
  consistency:
{consistency}
  stop:
    iterations: {clocks}
  reliable:
    count: 2
  transient:
    minNodes: 0
    maxNodes: 0
  bidding:
    strategy: BidBrain
    market:
      kind: trace
      trace: {trace}
    billingModel: aws
  elasticity:
    partitions: {args.partitions}
  runtime:
    workerThreads: 1
"""


# A GLIBC_TUNABLES value that keeps glibc's default malloc (tcache_count's default is 7) and
# stops `ebbflow run` from giving its nodes their fixed mmap threshold (NODE_MALLOC_TUNABLES).
GLIBC_DEFAULT = "glibc.malloc.tcache_count=7"


def train(ebbflow, path, out, in_process, tunables=None):
    """One `ebbflow run`: its summary and the peak RSS of each process. `tunables`, if set, is
    the GLIBC_TUNABLES the run and its nodes get."""
    command = [ebbflow, "run", path, "--quiet", "--out", out]
    if in_process:
        command.append("--in-process")
    what = "in-process" if in_process else "node processes"
    env = dict(os.environ)
    if tunables is not None:
        env["GLIBC_TUNABLES"] = tunables
        what += f" (GLIBC_TUNABLES={tunables})"
    print(f"==> {what}: {' '.join(command)}", file=sys.stderr, flush=True)
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
    sampler = PeakSampler(process.pid)
    sampler.start()
    stdout, _ = process.communicate()
    sampler.stop.set()
    sampler.join()
    sys.stderr.write(stdout)
    if process.returncode != 0:
        raise SystemExit(f"mf_nodes: {what} run failed (exit {process.returncode})")
    return json.load(open(os.path.join(out, "summary.json"))), sampler.peaks, sampler.cpu


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ebbflow", required=True, help="the ebbflow binary (release)")
    parser.add_argument("--trace", required=True, help="a spot trace of ../shared/data/spot")
    parser.add_argument("--ratings", type=int, default=25_000_000)
    parser.add_argument("--users", type=int, default=None,
                        help="default: the Netflix prize data's 208 ratings per user")
    parser.add_argument("--items", type=int, default=17_770)
    parser.add_argument("--rank", type=int, default=32)
    parser.add_argument("--clocks", type=int, default=256,
                        help="clocks of the long run (default: 4 passes of 64 clocks, what MF "
                             "cuts a pass into for 2 workers on this data)")
    parser.add_argument("--short-clocks", type=int, default=None,
                        help="clocks of the short run (default: a quarter of --clocks)")
    parser.add_argument("--staleness", type=int, default=0)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--bar", type=float, default=0.2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--glibc-default", action="store_true",
                        help="also run the node processes with glibc's default malloc (its "
                             "dynamic mmap threshold), against the fixed one `ebbflow run` "
                             "gives them")
    args = parser.parse_args()
    if args.users is None:
        args.users = round(args.ratings * 480_189 / 100_480_507)

    short = args.short_clocks or max(args.clocks // 4, 1)
    if not 0 < short < args.clocks:
        raise SystemExit(f"mf_nodes: --short-clocks {short} must be below --clocks {args.clocks}")
    with tempfile.TemporaryDirectory() as work:
        runs, node_cpu = {}, {}
        modes = [("in-process", True, None), ("processes", False, None)]
        if args.glibc_default:
            modes.append(("processes, glibc's default malloc", False, GLIBC_DEFAULT))
        for name, in_process, tunables in modes:
            walls, cpus = [], []
            for clocks in (short, args.clocks):
                path = os.path.join(work, f"job-{clocks}.yaml")
                with open(path, "w") as out:
                    out.write(manifest(args, args.trace, clocks))
                out = os.path.join(work, f"{len(runs)}-{clocks}")
                summary, peaks, cpu = train(args.ebbflow, path, out, in_process, tunables)
                walls.append(summary["wall_seconds"])
                cpus.append(cpu)
            # the difference leaves out start-up and data generation, which both runs pay
            runs[name] = (summary, args.clocks - short, walls[1] - walls[0], peaks, in_process)
            # the same difference of each node's CPU time (sampled every 0.2 s, so within that)
            if not in_process:
                node_cpu[name] = {
                    node: tuple(b - a for a, b in zip(cpus[0][node], cpus[1][node]))
                    for node in sorted(cpus[1]) if node != "run" and node in cpus[0]
                }

    width = args.rank + 1
    parameters = (args.users + args.items) * width * 4
    # a training rating is 12 bytes (user, item, value); each node's shard is its half of the
    # training set (the test set, PlantedRatings::test_fraction_for's 20 % or at most 1 M
    # ratings, is no node's: only the coordinator generates it, to evaluate)
    test = round(args.ratings * min(1_000_000 / args.ratings, 0.2))
    shard = (args.ratings - test) // 2 * 12
    target = 1.5 * (parameters / 2 + shard) + 64 * MIB
    table = [("data", f"planted rank 16, noise 0.1: {args.users} users x {args.items} items, "
                      f"{args.ratings} ratings; rank {args.rank}, staleness {args.staleness}, "
                      f"{args.partitions} partitions, {short} and {args.clocks} clocks, 2 workers "
                      f"(1 a node)")]
    rates = {}
    failed = []
    for name, (summary, clocks, seconds, peaks, in_process) in runs.items():
        rmse = summary["quality"].get("rmse", float("nan"))
        rates[name] = clocks / seconds
        table.append((f"{name}: the long run's clocks past the short run's ({clocks})",
                      f"{seconds:.1f} s ({clocks / seconds:.2f} clocks/s); after "
                      f"{summary['clocks']} clocks test rmse {rmse:.4f}"))
        if not rmse <= args.bar:
            failed.append(f"{name} ended at rmse {rmse} > {args.bar}")
        for node, peak in sorted(peaks.items()):
            if not in_process and node == "run":
                continue
            label = "the whole run (both nodes)" if node == "run" else f"node {node}"
            bound = 2 * target - 64 * MIB if node == "run" else target
            table.append((f"{name}: peak RSS of {label}",
                          f"{peak / MIB:.0f} MiB (target {bound / MIB:.0f} MiB: "
                          f"{peak / bound:.2f} of it)"))
    for name, nodes in node_cpu.items():
        table.append((f"{name}: CPU seconds of each node over those clocks (user + system)",
                      "; ".join(f"{node} {user:.1f} + {system:.1f}"
                                for node, (user, system) in nodes.items())))
    table.append(("node processes ÷ in-process, clocks per second (target >= 0.7)",
                  f"{rates['processes'] / rates['in-process']:.2f}"))
    if args.glibc_default:
        table.append(("node processes, fixed mmap threshold ÷ glibc's default, clocks per second",
                      f"{rates['processes'] / rates[modes[2][0]]:.2f}"))
    table.append(("one node's parameter partitions + shard",
                  f"{parameters / 2 / MIB:.1f} MiB + {shard / MIB:.1f} MiB"))
    print("| measurement | value |\n|---|---|")
    for what, value in table:
        print(f"| {what} | {value} |")
    if failed:
        raise SystemExit("mf_nodes: " + "; ".join(failed))


if __name__ == "__main__":
    main()
