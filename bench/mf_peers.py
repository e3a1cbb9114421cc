#!/usr/bin/env python3
"""Matrix-factorization peers on the split ebbflow-bench writes (user<TAB>item<TAB>rating, dense ids).

--peer torch:    biased MF in PyTorch on CPU, SGD with ebbflow's hyperparameters (rank, learning
                 rate and per-epoch decay, L2, init std); sparse embedding gradients summed over
                 mini-batches of 1024.
--peer surprise: scikit-surprise's SVD (SGD matrix factorization with biases).

Trains epoch by epoch until the test RMSE (predictions clipped to the training range) is <= the
target, timing training only. Prints one JSON object: peer, epochs, time_to_quality_s (null if the
target was not reached), quality (final test RMSE), updates_per_s (ratings per training second).
"""
import argparse
import json
import time

import numpy as np


def load(path):
    data = np.loadtxt(path, delimiter="\t", dtype=np.float64, ndmin=2)
    return data[:, 0].astype(np.int64), data[:, 1].astype(np.int64), data[:, 2].astype(np.float32)


def run_torch(args, train, test):
    import torch

    torch.manual_seed(args.seed)
    users_tr, items_tr, ratings_tr = (torch.from_numpy(a) for a in train)
    users_te, items_te, ratings_te = (torch.from_numpy(a) for a in test)
    num_users = int(max(users_tr.max(), users_te.max())) + 1
    num_items = int(max(items_tr.max(), items_te.max())) + 1
    width = args.rank + 1  # bias, then factors: the same layout as ebbflow
    # sparse gradients: each step touches only the batch's rows, as ebbflow's SGD does
    users = torch.nn.Embedding(num_users, width, sparse=True)
    items = torch.nn.Embedding(num_items, width, sparse=True)
    torch.nn.init.normal_(users.weight, std=args.init_std)
    torch.nn.init.normal_(items.weight, std=args.init_std)
    mean = float(ratings_tr.mean())
    low, high = float(ratings_tr.min()), float(ratings_tr.max())
    params = list(users.parameters()) + list(items.parameters())
    optimizer = torch.optim.SGD(params, lr=args.learning_rate)
    n = len(ratings_tr)

    def predict(u, i):
        pu, qi = users(u), items(i)
        return mean + pu[:, 0] + qi[:, 0] + (pu[:, 1:] * qi[:, 1:]).sum(dim=1)

    def rmse():
        with torch.no_grad():
            prediction = predict(users_te, items_te).clamp(low, high)
            return float(((prediction - ratings_te) ** 2).mean().sqrt())

    trained = 0.0
    reached = None
    quality = rmse()
    epoch = 0
    generator = torch.Generator().manual_seed(args.seed)
    for epoch in range(1, args.max_epochs + 1):
        for group in optimizer.param_groups:
            group["lr"] = args.learning_rate * args.decay ** (epoch - 1)
        start = time.perf_counter()
        order = torch.randperm(n, generator=generator)
        for begin in range(0, n, args.batch_size):
            index = order[begin:begin + args.batch_size]
            u, i, r = users_tr[index], items_tr[index], ratings_tr[index]
            pu, qi = users(u), items(i)
            error = r - (mean + pu[:, 0] + qi[:, 0] + (pu[:, 1:] * qi[:, 1:]).sum(dim=1))
            loss = 0.5 * (error ** 2).sum() + 0.5 * args.regularization * (
                (pu ** 2).sum() + (qi ** 2).sum())
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        trained += time.perf_counter() - start
        quality = rmse()
        if quality <= args.target:
            reached = trained
            break
    return {
        "peer": f"torch {torch.__version__} (SGD, batch {args.batch_size}, "
                f"{torch.get_num_threads()} threads)",
        "epochs": epoch,
        "time_to_quality_s": reached,
        "quality": quality,
        "updates_per_s": n * epoch / trained,
    }


def run_surprise(args, train, test):
    import surprise

    reader = surprise.Reader(line_format="user item rating", sep="\t", rating_scale=(1, 5))
    data = surprise.Dataset.load_from_file(args.train, reader=reader)
    trainset = data.build_full_trainset()
    testset = [(str(u), str(i), float(r)) for u, i, r in zip(*test)]
    n = trainset.n_ratings
    quality, reached, epochs, seconds = None, None, 0, 0.0
    # SVD trains all epochs in one fit: refit from scratch with one more epoch until the target
    # is met; the time to quality is the fit time of the first model that meets it.
    for epochs in range(1, args.max_epochs + 1):
        algo = surprise.SVD(n_factors=args.rank, n_epochs=epochs, lr_all=args.learning_rate,
                            reg_all=args.regularization, init_std_dev=args.init_std,
                            random_state=args.seed)
        start = time.perf_counter()
        algo.fit(trainset)
        seconds = time.perf_counter() - start
        quality = surprise.accuracy.rmse(algo.test(testset), verbose=False)
        if quality <= args.target:
            reached = seconds
            break
    return {
        "peer": f"scikit-surprise {surprise.__version__} SVD",
        "epochs": epochs,
        "time_to_quality_s": reached,
        "quality": quality,
        "updates_per_s": n * epochs / seconds,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--peer", choices=["torch", "surprise"], required=True)
    parser.add_argument("--train", required=True)
    parser.add_argument("--test", required=True)
    parser.add_argument("--target", type=float, required=True, help="test RMSE to reach")
    parser.add_argument("--rank", type=int, default=32)
    parser.add_argument("--learning-rate", type=float, default=0.01)
    parser.add_argument("--decay", type=float, default=0.92)
    parser.add_argument("--regularization", type=float, default=0.05)
    parser.add_argument("--init-std", type=float, default=0.1)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--max-epochs", type=int, default=60)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    train, test = load(args.train), load(args.test)
    result = run_torch(args, train, test) if args.peer == "torch" else run_surprise(args, train, test)
    result["target"] = args.target
    print(json.dumps(result))


if __name__ == "__main__":
    main()
