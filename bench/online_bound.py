#!/usr/bin/env python3
"""What buying from a pool's observable state can cost per unit of work, on a trace with
availability data (the p3.2xlarge 9-zone trace), measured in hindsight on the trace's later 70%.

For every sample where a pool can be bought, one instance launched then is followed to its
eviction (the pool goes unavailable, or, bidding at the current price, the price rises above
it) and held at most its first hour under today's `aws` billing: interrupted by EC2 within the
hour it costs nothing, otherwise the hour is paid. Work is its time up in that hour, less the
switch-in σ and, if evicted, the stall λ (the simulator's defaults: 60 s and 120 s). Grouped by
what a bidder can observe when it buys (pool, how long the pool has been buyable, bid), the
ratio expected charge / expected work, relative to the on-demand price, is the best cost per
work of any bidder that decides from those observations (the averages are taken on the very
slice they are scored on, which favours the bidder). The hindsight schedule of `ebbflow
simulate` knows which launches are interrupted and pays for almost none of them.

    python3 bench/online_bound.py ../shared/data/spot/aws_p3.2xlarge_availability_price_9az_2023-02-15_to_03-09.csv
"""
import collections
import csv
import datetime as dt
import sys

ON_DEMAND = 3.06  # p3.2xlarge, us-east-1 (the trace's pools share it in the simulator)
SIGMA, LAMBDA, HOUR = 60.0, 120.0, 3600.0
BUCKET = 600  # run-age buckets of 10 minutes; the last holds every age from an hour on


def main(path):
    with open(path) as f:
        rows = list(csv.reader(f))
    header, rows = rows[0], rows[1:]
    if not header or header[0] != "timestamp_utc" or (len(header) - 1) % 2:
        sys.exit(f"{path}: line 1: not the availability+price trace (timestamp_utc, then "
                 "<zone>_available,<zone>_spot_usd_hr pairs)")
    at = [dt.datetime.fromisoformat(r[0].replace("Z", "+00:00")).timestamp() for r in rows]
    pools = [header[i].rsplit("_available", 1)[0] for i in range(1, len(header), 2)]
    n = len(at)
    first = int(n * 0.3)
    best = {}
    print(f"{path}: {n} samples, {len(pools)} pools; launches at samples {first}..{n}")
    print("expected charge / expected work ÷ on-demand price, by run age (10-min buckets):")
    for bid_at_price in (True, False):
        label = "bid at the price (a rise evicts)" if bid_at_price else "bid high (only unavailability evicts)"
        print(f"\n{label}")
        for k, pool in enumerate(pools):
            up = [r[1 + 2 * k] == "1" for r in rows]
            price = [float(r[2 + 2 * k]) for r in rows]
            groups = collections.defaultdict(lambda: [0, 0, 0.0, 0.0])
            since = None
            for i in range(n):
                if not up[i]:
                    since = None
                    continue
                if since is None:
                    since = at[i]
                if i < first:
                    continue
                # follow the launch to its eviction (or the trace's end: censored, left out)
                end = None
                for j in range(i + 1, n):
                    if at[j] - at[i] >= HOUR:
                        end = at[i] + HOUR  # survived the hour
                        break
                    if not up[j] or (bid_at_price and price[j] > price[i]):
                        end = at[j]
                        break
                if end is None:
                    continue
                life = end - at[i]
                g = groups[min(int((at[i] - since) // BUCKET), 6)]
                g[0] += 1
                g[1] += life >= HOUR
                g[2] += min(life, HOUR)
                g[3] += price[i]
            cells = []
            for bucket in range(7):
                count, survived, seconds, prices = groups[bucket]
                if count < 20:
                    cells.append("   -  ")
                    continue
                s = survived / count
                work = seconds / count - SIGMA - LAMBDA * (1 - s)
                ratio = (prices / count) * s * HOUR / work / ON_DEMAND if work > 0 else float("inf")
                cells.append(f"{ratio:6.3f}")
                key = (ratio, pool, bucket, label)
                best[label] = min(best.get(label, key), key)
            print(f"  {pool:<11} " + " ".join(cells))
    print()
    for label, (ratio, pool, bucket, _) in best.items():
        print(f"lowest, {label}: {ratio:.3f} of on-demand per work ({pool}, run age "
              f"{bucket * 10}-{bucket * 10 + 10} min)")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
