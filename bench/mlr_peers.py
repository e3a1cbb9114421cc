#!/usr/bin/env python3
"""Multinomial logistic regression peers on the split ebbflow-bench writes (CSV: scaled features,
then the class).

--peer torch:   softmax regression in PyTorch on CPU with ebbflow's hyperparameters (mini-batch
                SGD, learning rate and per-epoch decay, L2 on weights, per-epoch shuffle).
--peer sgd:     scikit-learn SGDClassifier(loss="log_loss"), one partial_fit per epoch.
--peer lbfgs:   scikit-learn LogisticRegression (lbfgs, multinomial), one fit to convergence.

Trains until test accuracy >= the target, timing training only. Prints one JSON object: peer,
epochs, time_to_quality_s (null if not reached), quality (final test accuracy), updates_per_s.
"""
import argparse
import json
import time

import numpy as np


def load(path):
    data = np.loadtxt(path, delimiter=",", dtype=np.float32, ndmin=2)
    return np.ascontiguousarray(data[:, :-1]), data[:, -1].astype(np.int64)


def run_torch(args, x_train, y_train, x_test, y_test):
    import torch

    torch.manual_seed(args.seed)
    xtr, ytr = torch.from_numpy(x_train), torch.from_numpy(y_train)
    xte, yte = torch.from_numpy(x_test), torch.from_numpy(y_test)
    classes = int(max(y_train.max(), y_test.max())) + 1
    model = torch.nn.Linear(x_train.shape[1], classes)
    torch.nn.init.zeros_(model.weight)
    torch.nn.init.zeros_(model.bias)
    optimizer = torch.optim.SGD([
        {"params": [model.weight], "weight_decay": args.regularization},
        {"params": [model.bias], "weight_decay": 0.0},
    ], lr=args.learning_rate)
    loss_fn = torch.nn.CrossEntropyLoss()
    n = len(ytr)
    generator = torch.Generator().manual_seed(args.seed)

    def accuracy():
        with torch.no_grad():
            return float((model(xte).argmax(dim=1) == yte).float().mean())

    trained, reached, quality, epoch = 0.0, None, accuracy(), 0
    for epoch in range(1, args.max_epochs + 1):
        for group in optimizer.param_groups:
            group["lr"] = args.learning_rate * args.decay ** (epoch - 1)
        start = time.perf_counter()
        order = torch.randperm(n, generator=generator)
        for begin in range(0, n, args.batch_size):
            index = order[begin:begin + args.batch_size]
            loss = loss_fn(model(xtr[index]), ytr[index])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        trained += time.perf_counter() - start
        quality = accuracy()
        if quality >= args.target:
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


def run_sgd(args, x_train, y_train, x_test, y_test):
    import sklearn
    from sklearn.linear_model import SGDClassifier

    model = SGDClassifier(loss="log_loss", alpha=args.regularization, random_state=args.seed)
    classes = np.unique(np.concatenate([y_train, y_test]))
    trained, reached, quality, epoch = 0.0, None, 0.0, 0
    for epoch in range(1, args.max_epochs + 1):
        start = time.perf_counter()
        model.partial_fit(x_train, y_train, classes=classes)
        trained += time.perf_counter() - start
        quality = float(model.score(x_test, y_test))
        if quality >= args.target:
            reached = trained
            break
    return {
        "peer": f"scikit-learn {sklearn.__version__} SGDClassifier(log_loss)",
        "epochs": epoch,
        "time_to_quality_s": reached,
        "quality": quality,
        "updates_per_s": len(y_train) * epoch / trained,
    }


def run_lbfgs(args, x_train, y_train, x_test, y_test):
    import sklearn
    from sklearn.linear_model import LogisticRegression

    model = LogisticRegression(C=1.0 / (args.regularization * len(y_train)), max_iter=1000)
    start = time.perf_counter()
    model.fit(x_train, y_train)
    seconds = time.perf_counter() - start
    quality = float(model.score(x_test, y_test))
    return {
        "peer": f"scikit-learn {sklearn.__version__} LogisticRegression(lbfgs)",
        "epochs": int(np.max(model.n_iter_)),
        "time_to_quality_s": seconds if quality >= args.target else None,
        "quality": quality,
        "updates_per_s": len(y_train) * int(np.max(model.n_iter_)) / seconds,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--peer", choices=["torch", "sgd", "lbfgs"], required=True)
    parser.add_argument("--train", required=True)
    parser.add_argument("--test", required=True)
    parser.add_argument("--target", type=float, required=True, help="test accuracy to reach")
    parser.add_argument("--learning-rate", type=float, default=0.5)
    parser.add_argument("--decay", type=float, default=0.95)
    parser.add_argument("--regularization", type=float, default=1e-4)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-epochs", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    x_train, y_train = load(args.train)
    x_test, y_test = load(args.test)
    run = {"torch": run_torch, "sgd": run_sgd, "lbfgs": run_lbfgs}[args.peer]
    result = run(args, x_train, y_train, x_test, y_test)
    result["target"] = args.target
    print(json.dumps(result))


if __name__ == "__main__":
    main()
