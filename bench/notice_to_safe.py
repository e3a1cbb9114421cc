#!/usr/bin/env python3
"""Notice -> safe across real node processes (issue 4).

Runs the integer-exact app with MIB mebibytes of parameters over 4 `ebbflow-runtime
elastic-node` processes on 127.0.0.1 (1 reliable + 3 transient: stage 2), then:

1. partial eviction: SIGTERM (a notice with the node's grace period) to the transient node
   that serves the most partitions; its partitions move to the surviving nodes;
2. full eviction: SIGTERM to both remaining transient nodes; every partition flushes to the
   reliable node's BackupPS, which then serves it (stage 1).

The coordinator measures each notice -> every affected partition installed on its new owner
(`notice_to_safe_seconds` in its report). The job must end with the exact table. Each round
is a fresh job; prints one row per round and the medians.

    python3 bench/notice_to_safe.py BIN [--mib 64] [--rounds 3] [--bandwidth-limit-mbps 0]

BIN is a release build of `ebbflow-runtime` (scripts/bench-notice-to-safe.sh builds it).
"""

import argparse
import json
import os
import random
import signal
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

SECRET = "bench-notice-to-safe"
WIDTH = 64  # values per row; 4 bytes each


def admin_tls(binary):
    """TLS for the admin API: trusts only the certificate the job secret derives (it names no
    host, so host names are not checked)."""
    pem = subprocess.run(
        [binary, "admin-certificate"], env=dict(os.environ, EBBFLOW_JOB_SECRET=SECRET),
        capture_output=True, text=True, check=True,
    ).stdout
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.load_verify_locations(cadata=pem)
    return context


# Set by main() from the binary: status() calls the admin API over TLS with it.
ADMIN_TLS = None


def status(url):
    request = urllib.request.Request(
        f"{url}/status", headers={"Authorization": f"Bearer {SECRET}"}
    )
    with urllib.request.urlopen(request, timeout=10, context=ADMIN_TLS) as response:
        return json.load(response)


def wait_for(url, coordinator, what, ready, within=600.0):
    deadline = time.monotonic() + within
    while True:
        if coordinator.poll() is not None:
            sys.exit(f"the coordinator exited ({coordinator.returncode}) before {what}")
        try:
            s = status(url)
        except OSError:
            s = None
        if s is not None:
            if s["phase"] in ("Done", "Failed"):
                sys.exit(f"the job ended before {what}: {s.get('error')}")
            if ready(s):
                return s
        if time.monotonic() > deadline:
            sys.exit(f"timed out waiting for {what}: {s}")
        time.sleep(0.05)


def progress(s):
    return s.get("progress") or {}


def one_round(args, out, round_no):
    rows = args.mib * 1024 * 1024 // (WIDTH * 4)
    flags = [
        "--app", "exact", "--exact-rows", str(rows), "--exact-width", str(WIDTH),
        "--exact-tables", "1", "--exact-clock-ms", str(args.clock_ms),
        "--clocks", str(args.clocks), "--staleness", "0", "--partitions", "8",
        "--job-workers", "4",
    ]
    env = dict(os.environ, EBBFLOW_JOB_SECRET=SECRET)
    report_path = os.path.join(out, f"report-{round_no}.json")
    logs = []

    def log(name):
        f = open(os.path.join(out, f"{name}-{round_no}.log"), "w")
        logs.append(f)
        return f

    coordinator = subprocess.Popen(
        [args.bin, "elastic-coordinator", *flags, "--listen", "127.0.0.1:0",
         "--reliable-nodes", "1", "--backup-every", "5", "--report-out", report_path],
        stdout=subprocess.PIPE, stderr=log("coordinator"), env=env, text=True,
    )
    children = {}
    try:
        line = coordinator.stdout.readline()
        if not line.startswith("listening on "):
            sys.exit(f"the coordinator did not start: {line!r}")
        url = "https://" + line.split()[-1]

        def start(name, transient):
            cmd = [args.bin, "elastic-node", *flags, "--coordinator", url, "--name", name,
                   "--grace-seconds", "60",
                   "--bandwidth-limit-mbps", str(args.bandwidth_limit_mbps)]
            if transient:
                cmd.append("--transient")
            children[name] = subprocess.Popen(cmd, stdout=subprocess.DEVNULL,
                                              stderr=log(name), env=env)

        start("r0", False)
        # t0 first, so it is the longest-lived transient node and an ActivePS.
        start("t0", True)
        wait_for(url, coordinator, "t0 to join", lambda s: progress(s).get("transient_nodes", 0) >= 1)
        # A random pause lets t1 and t2 join while a segment runs, not only at a boundary: the
        # path where the coordinator pauses the nodes and agrees an end (it hung once).
        time.sleep(random.uniform(0.0, args.join_stagger_s))
        start("t1", True)
        start("t2", True)
        joined = wait_for(
            url, coordinator, "3 transient nodes in stage 2",
            lambda s: progress(s).get("transient_nodes") == 3 and progress(s).get("stage") == 2,
        )
        at = progress(joined)["clock"]
        s = wait_for(url, coordinator, "a boundary in stage 2",
                     lambda s: progress(s)["clock"] > at and progress(s).get("stage") == 2)
        ids = {n["name"]: n["node"] for n in s["nodes"]}
        served = {name: sum(1 for p in s["partitions"] if p["owner"] == ids.get(name))
                  for name in ("t0", "t1", "t2")}
        leaver = max(served, key=served.get)
        if served[leaver] == 0:
            sys.exit(f"no transient node serves a partition: {s['partitions']}")

        # 1. Partial eviction with notice.
        children[leaver].send_signal(signal.SIGTERM)
        after = wait_for(url, coordinator, f"{leaver} to leave",
                         lambda s: progress(s).get("transient_nodes") == 2)
        at = progress(after)["clock"]
        wait_for(url, coordinator, "a boundary after the partial eviction",
                 lambda s: progress(s)["clock"] > at)

        # 2. Full eviction with notice.
        rest = [n for n in ("t0", "t1", "t2") if n != leaver]
        for name in rest:
            children[name].send_signal(signal.SIGTERM)
        wait_for(url, coordinator, "the full eviction",
                 lambda s: progress(s).get("transient_nodes") == 0 and progress(s).get("stage") == 1)

        if coordinator.wait(timeout=1800) != 0:
            sys.exit(f"the coordinator failed; see {out}/coordinator-{round_no}.log")
        for child in children.values():
            child.wait(timeout=120)
    finally:
        for child in [coordinator, *children.values()]:
            if child.poll() is None:
                child.kill()
                child.wait()
        for f in logs:
            f.close()

    with open(report_path) as f:
        report = json.load(f)
    metrics = dict(report["run"]["eval"]["metrics"])
    wrong = metrics.get("wrong_values")
    if wrong != 0:
        sys.exit(f"round {round_no}: the table is not exact: wrong_values = {wrong}")
    safe = report["notice_to_safe_seconds"]
    if len(safe) < 2:
        sys.exit(f"round {round_no}: expected two notices acted on, got {safe}")
    return {
        "leaver": leaver,
        "served": served[leaver],
        "partial": safe[0],
        "full": safe[-1],
        "params": report["run"]["parameter_bytes"],
        "events": report["events"],
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bin")
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clocks", type=int, default=400)
    parser.add_argument("--clock-ms", type=int, default=20)
    parser.add_argument("--bandwidth-limit-mbps", type=float, default=0.0)
    parser.add_argument("--join-stagger-s", type=float, default=2.5,
                        help="t1 and t2 join up to this many seconds after t0 (uniform)")
    args = parser.parse_args()
    if args.mib < 1 or args.rounds < 1:
        sys.exit("--mib and --rounds must be at least 1")
    global ADMIN_TLS
    ADMIN_TLS = admin_tls(args.bin)

    results = []
    with tempfile.TemporaryDirectory() as out:
        for r in range(1, args.rounds + 1):
            started = time.monotonic()
            results.append(one_round(args, out, r))
            results[-1]["wall"] = time.monotonic() - started
    mib = results[0]["params"] / (1024 * 1024)
    limit = (f"{args.bandwidth_limit_mbps:g} Mbit/s per node"
             if args.bandwidth_limit_mbps > 0 else "unlimited")
    print(f"## notice to safe: {mib:.1f} MiB over 4 node processes (1 reliable + 3 transient), "
          f"loopback, {limit}")
    print()
    print("| round | partial: node (partitions) | partial eviction notice -> safe, s "
          "| full eviction notice -> safe, s | table exact | wall, s |")
    print("|---|---|---|---|---|---|")
    for i, r in enumerate(results, 1):
        print(f"| {i} | {r['leaver']} ({r['served']}) | {r['partial']:.3f} | {r['full']:.3f} "
              f"| yes | {r['wall']:.0f} |")
    print()
    partial = statistics.median(r["partial"] for r in results)
    full = statistics.median(r["full"] for r in results)
    worst = max(max(r["partial"], r["full"]) for r in results)
    print(f"median notice -> safe: partial {partial:.3f} s, full {full:.3f} s; "
          f"worst {worst:.3f} s (target <= 2 s: {'met' if worst <= 2.0 else 'missed'})")


if __name__ == "__main__":
    main()
