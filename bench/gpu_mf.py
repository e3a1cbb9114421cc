"""Matrix factorization with PyTorch on one GPU: the GPU side of issue 36's cost-per-work
comparison (ratings per second at rank 32 and 1000 on Netflix-shaped synthetic data).

    python3 bench/gpu_mf.py [--ratings 100000000] [--ranks 32,1000] [--epochs 2]

Data: a planted rank-``true_rank`` model plus Gaussian noise (std 0.1), 480,189 users x 17,770
items (the Netflix shape), generated on the device; 1% held out. Training: mini-batch SGD with
the update rule of ebbflow's MF (per-rating gradients, summed per row with index_add_), batch
2^20, the rate scaled down by an item's ratings per batch. Prints one JSON line per rank: ratings/s, seconds per epoch, test RMSE per epoch.
"""

import argparse
import json
import time

import torch


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ratings", type=int, default=100_000_000)
    parser.add_argument("--users", type=int, default=480_189)
    parser.add_argument("--items", type=int, default=17_770)
    parser.add_argument("--ranks", default="32,1000")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch", type=int, default=1 << 20)
    parser.add_argument("--true-rank", type=int, default=16)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator(device=device).manual_seed(42)
    n = args.ratings
    u = torch.randint(0, args.users, (n,), device=device, generator=g)
    i = torch.randint(0, args.items, (n,), device=device, generator=g)
    pu = torch.randn(args.users, args.true_rank, device=device, generator=g) / args.true_rank**0.25
    qi = torch.randn(args.items, args.true_rank, device=device, generator=g) / args.true_rank**0.25
    r = (pu[u] * qi[i]).sum(1) + 0.1 * torch.randn(n, device=device, generator=g)
    del pu, qi
    test = n // 100
    for rank in [int(x) for x in args.ranks.split(",")]:
        P = torch.randn(args.users, rank, device=device, generator=g) / rank**0.5
        Q = torch.randn(args.items, rank, device=device, generator=g) / rank**0.5
        # Per-rating SGD steps summed per row: an item's step in one batch grows with its
        # ratings in the batch, so the per-rating rate shrinks with the batch's ratings per item.
        per_item = args.batch / args.items
        lr, reg = min(0.05, 0.5 / per_item), 0.01
        rmses, epoch_seconds = [], []
        for epoch in range(args.epochs):
            if device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            for b in range(test, n, args.batch):
                ub, ib, rb = u[b : b + args.batch], i[b : b + args.batch], r[b : b + args.batch]
                p, q = P[ub], Q[ib]
                err = rb - (p * q).sum(1)
                P.index_add_(0, ub, lr * (err[:, None] * q - reg * p))
                Q.index_add_(0, ib, lr * (err[:, None] * p - reg * q))
            if device == "cuda":
                torch.cuda.synchronize()
            epoch_seconds.append(time.perf_counter() - start)
            with torch.no_grad():
                pred = (P[u[:test]] * Q[i[:test]]).sum(1)
                rmses.append(float(((pred - r[:test]) ** 2).mean().sqrt()))
        best = min(epoch_seconds)
        print(json.dumps({
            "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
            "rank": rank, "ratings": n - test, "batch": args.batch,
            "seconds_per_epoch": round(best, 4),
            "ratings_per_second": round((n - test) / best),
            "test_rmse_per_epoch": [round(x, 4) for x in rmses],
        }), flush=True)
        del P, Q


if __name__ == "__main__":
    main()
