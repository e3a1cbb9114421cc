#!/usr/bin/env python3
"""Convergence at any worker count (issue 39): time to quality and final quality of MF
(MovieLens 100K), MLR (digits) and LDA (reuters) at 1, 2, 4, 8, 16 and 32 logical workers, in
one process (`ebbflow-runtime local`) and over node processes (`elastic-coordinator` and two
`elastic-node` processes on 127.0.0.1, the workers spread over them).

A job's clock is a slice of a pass whose size the app picks from the worker count (and, for MF,
the staleness), so each run is asked for a number of passes: the clocks are passes x the clocks
a pass takes, which the run logs. Time to quality is the training time (evaluation excluded)
of the shortest run, in passes from the app's schedule, whose final evaluation reaches the bar;
final quality is that of the longest run of the schedule. Prints a Markdown table per mode with
each count's time over the best count's.

    python3 bench/convergence.py BIN [--apps mf,mlr,lda] [--workers 1,2,4,8,16,32]
        [--modes local,processes] [--staleness 2]

BIN is a release build of `ebbflow-runtime`; EBBFLOW_DATA_DIR holds the data sets
(scripts/fetch-data.sh).
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

SECRET = "bench-convergence"

# app: (metric, bar, higher is better, passes to try in order)
APPS = {
    "mf": ("rmse", 0.95, False, [2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 20]),
    "mlr": ("accuracy", 0.95, True, [1, 2, 3, 4, 6, 8, 12, 16, 24]),
    "lda": ("per_token_log_likelihood", -7.8069, True, [400, 700, 1000, 1500, 2000, 3000]),
}


def clocks_per_pass(bin_, app, workers, staleness):
    """The clocks a pass takes, as the runtime logs it at the start of a local run."""
    out = subprocess.run(
        [bin_, "local", "--app", app, "--clocks", "1", "--workers", str(workers),
         "--staleness", str(staleness), "--log-json"],
        capture_output=True, text=True, check=True,
    )
    found = re.search(r'"clocks_per_pass":(\d+)', out.stderr)
    if not found:
        sys.exit(f"no clocks_per_pass in the log of {app} with {workers} workers")
    return int(found.group(1))


def run_local(bin_, app, workers, staleness, clocks):
    out = subprocess.run(
        [bin_, "local", "--app", app, "--clocks", str(clocks), "--workers", str(workers),
         "--staleness", str(staleness), "--partitions", "8"],
        capture_output=True, text=True,
    )
    if out.returncode != 0:
        return None, out.stderr.strip().splitlines()[-1] if out.stderr else "failed"
    report = json.loads(out.stdout)
    return report, None


def run_processes(bin_, app, workers, staleness, clocks, scratch):
    flags = ["--app", app, "--clocks", str(clocks), "--staleness", str(staleness),
             "--partitions", "8", "--job-workers", str(workers)]
    env = dict(os.environ, EBBFLOW_JOB_SECRET=SECRET)
    report_path = os.path.join(scratch, "report.json")
    if os.path.exists(report_path):
        os.remove(report_path)
    logs = [open(os.path.join(scratch, f"{name}.log"), "w") for name in ("c", "r0", "r1")]
    coordinator = subprocess.Popen(
        [bin_, "elastic-coordinator", *flags, "--listen", "127.0.0.1:0",
         "--reliable-nodes", "2", "--report-out", report_path],
        stdout=subprocess.PIPE, stderr=logs[0], env=env, text=True,
    )
    nodes = []
    try:
        line = coordinator.stdout.readline()
        if not line.startswith("listening on "):
            return None, f"the coordinator did not start: {line!r}"
        url = "https://" + line.split()[-1]
        for i, name in enumerate(("r0", "r1")):
            nodes.append(subprocess.Popen(
                [bin_, "elastic-node", *flags, "--coordinator", url, "--name", name],
                stdout=subprocess.DEVNULL, stderr=logs[i + 1], env=env,
            ))
        code = coordinator.wait(timeout=1800)
        for node in nodes:
            node.wait(timeout=120)
    finally:
        for child in [coordinator, *nodes]:
            if child.poll() is None:
                child.kill()
                child.wait()
        for f in logs:
            f.close()
    if code != 0:
        with open(os.path.join(scratch, "c.log")) as f:
            tail = [l for l in f.read().splitlines() if "rror" in l][-1:]
        return None, tail[0] if tail else f"coordinator exit {code}"
    with open(report_path) as f:
        report = json.load(f)["run"]
    return report, None


def metric(report, name):
    return dict(report["eval"]["metrics"]).get(name)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("bin")
    parser.add_argument("--apps", default="mf,mlr,lda")
    parser.add_argument("--workers", default="1,2,4,8,16,32")
    parser.add_argument("--modes", default="local,processes")
    parser.add_argument("--staleness", type=int, default=2)
    args = parser.parse_args()
    workers_list = [int(w) for w in args.workers.split(",")]
    scratch = tempfile.mkdtemp(prefix="ebbflow-convergence-")
    for mode in args.modes.split(","):
        for app in args.apps.split(","):
            name, bar, higher, schedule = APPS[app]
            reached = lambda v: v is not None and (v >= bar if higher else v <= bar)
            rows = []
            for workers in workers_list:
                per_pass = clocks_per_pass(args.bin, app, workers, args.staleness)
                to_quality, final, error = None, None, None
                for passes in schedule:
                    clocks = passes * per_pass
                    if mode == "local":
                        report, error = run_local(args.bin, app, workers, args.staleness, clocks)
                    else:
                        report, error = run_processes(
                            args.bin, app, workers, args.staleness, clocks, scratch)
                    if report is None:
                        break
                    value = metric(report, name)
                    final = (passes, value)
                    if to_quality is None and reached(value):
                        to_quality = (passes, report["elapsed_seconds"], value)
                        break
                rows.append((workers, per_pass, to_quality, final, error))
                print(f"{mode} {app} W={workers}: {per_pass} clocks/pass, to quality {to_quality}, "
                      f"last {final}, error {error}", file=sys.stderr, flush=True)
            times = [r[2][1] for r in rows if r[2]]
            best = min(times) if times else None
            print(f"\n### {app} ({name} {'>=' if higher else '<='} {bar}), {mode}, "
                  f"staleness {args.staleness}\n")
            print("| logical workers | clocks a pass | passes to the bar | time to the bar | "
                  "/ best count | quality there |")
            print("|---|---|---|---|---|---|")
            for workers, per_pass, to_quality, final, error in rows:
                if to_quality:
                    passes, seconds, value = to_quality
                    print(f"| {workers} | {per_pass} | {passes} | {seconds:.3f} s | "
                          f"{seconds / best:.2f} | {value:.4f} |")
                else:
                    last = f"{final[1]:.4f} after {final[0]} passes" if final else error
                    print(f"| {workers} | {per_pass} | not reached | | | {last} |")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
