#!/usr/bin/env python3
"""Multinomial logistic regression peers on the split ebbflow-bench writes (CSV: scaled features,
then the class), or ebbflow-mlr-scale's (--format f32: float32 little-endian rows of --features
values, then the class).

--peer torch:   softmax regression in PyTorch on CPU with ebbflow's hyperparameters (mini-batch
                SGD, learning rate and per-epoch decay, L2 on weights, per-epoch shuffle).
--peer sgd:     scikit-learn SGDClassifier(loss="log_loss"), one partial_fit per epoch (its own
                learning-rate schedule; one-vs-rest over --threads jobs).
--peer lbfgs:   scikit-learn LogisticRegression (lbfgs, multinomial), one fit to convergence.

Trains until the test metric reaches the target (--metric accuracy: at least it; cross_entropy,
the mean negative log-likelihood in nats: at most it), timing training only. Prints one JSON
object: peer, epochs, time_to_quality_s (null if not reached), quality (the final test metric),
updates_per_s.
"""
import argparse
import json
import time

import numpy as np


def reached(args, quality):
    return quality >= args.target if args.metric == "accuracy" else quality <= args.target


def sklearn_quality(args, model, x_test, y_test):
    if args.metric == "accuracy":
        return float(model.score(x_test, y_test))
    from sklearn.metrics import log_loss
    return float(log_loss(y_test, model.predict_proba(x_test), labels=model.classes_))


def load(path, fmt="csv", features=None):
    if fmt == "f32":
        data = np.fromfile(path, dtype="<f4")
        width = features + 1
        if data.size % width:
            raise SystemExit(f"{path}: {data.size} values are not rows of {features} features "
                             f"and a class")
        data = data.reshape(-1, width)
    else:
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

    def quality_now():
        with torch.no_grad():
            logits = model(xte)
            if args.metric == "cross_entropy":
                return float(loss_fn(logits, yte))
            return float((logits.argmax(dim=1) == yte).float().mean())

    trained, at, quality, epoch = 0.0, None, quality_now(), 0
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
        quality = quality_now()
        if reached(args, quality):
            at = trained
            break
    return {
        "peer": f"torch {torch.__version__} (SGD, batch {args.batch_size}, "
                f"{torch.get_num_threads()} threads)",
        "epochs": epoch,
        "time_to_quality_s": at,
        "quality": quality,
        "updates_per_s": n * epoch / trained,
    }


def run_sgd(args, x_train, y_train, x_test, y_test):
    import sklearn
    from sklearn.linear_model import SGDClassifier

    model = SGDClassifier(loss="log_loss", alpha=args.regularization, random_state=args.seed,
                          n_jobs=args.threads)
    classes = np.unique(np.concatenate([y_train, y_test]))
    trained, at, quality, epoch = 0.0, None, 0.0, 0
    for epoch in range(1, args.max_epochs + 1):
        start = time.perf_counter()
        model.partial_fit(x_train, y_train, classes=classes)
        trained += time.perf_counter() - start
        quality = sklearn_quality(args, model, x_test, y_test)
        if reached(args, quality):
            at = trained
            break
    return {
        "peer": f"scikit-learn {sklearn.__version__} SGDClassifier(log_loss)",
        "epochs": epoch,
        "time_to_quality_s": at,
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
    quality = sklearn_quality(args, model, x_test, y_test)
    return {
        "peer": f"scikit-learn {sklearn.__version__} LogisticRegression(lbfgs)",
        "epochs": int(np.max(model.n_iter_)),
        "time_to_quality_s": seconds if reached(args, quality) else None,
        "quality": quality,
        "updates_per_s": len(y_train) * int(np.max(model.n_iter_)) / seconds,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--peer", choices=["torch", "sgd", "lbfgs"], required=True)
    parser.add_argument("--format", choices=["csv", "f32"], default="csv")
    parser.add_argument("--features", type=int, help="features per row (--format f32)")
    parser.add_argument("--threads", type=int, help="threads for torch (default: its own choice)")
    parser.add_argument("--train", required=True)
    parser.add_argument("--test", required=True)
    parser.add_argument("--target", type=float, required=True, help="test metric to reach")
    parser.add_argument("--metric", choices=["accuracy", "cross_entropy"], default="accuracy")
    parser.add_argument("--learning-rate", type=float, default=0.5)
    parser.add_argument("--decay", type=float, default=0.95)
    parser.add_argument("--regularization", type=float, default=1e-4)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-epochs", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    if args.format == "f32" and not args.features:
        parser.error("--format f32 needs --features")
    if args.threads and args.peer == "torch":
        import torch
        torch.set_num_threads(args.threads)
    x_train, y_train = load(args.train, args.format, args.features)
    x_test, y_test = load(args.test, args.format, args.features)
    run = {"torch": run_torch, "sgd": run_sgd, "lbfgs": run_lbfgs}[args.peer]
    result = run(args, x_train, y_train, x_test, y_test)
    result["target"] = args.target
    print(json.dumps(result))


if __name__ == "__main__":
    main()
