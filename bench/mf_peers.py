#!/usr/bin/env python3
"""Matrix-factorization peers on the split ebbflow-bench writes (user<TAB>item<TAB>rating, dense ids)
or, with --format f32, the split ebbflow-mf-scale writes (float32 triples user, item, rating).

--peer torch:    biased MF in PyTorch on CPU, SGD with ebbflow's hyperparameters (rank, learning
                 rate and per-epoch decay, L2, init std); sparse embedding gradients summed over
                 mini-batches of 1024.
--peer surprise: scikit-surprise's SVD (SGD matrix factorization with biases).
--peer spark:    Spark MLlib ALS (pyspark, local mode on --threads cores): alternating least squares
                 with ebbflow's rank; its regParam is --spark-reg (ALS-WR: Spark scales it by each
                 row's rating count, so SGD's L2 does not carry over). ALS trains all iterations in
                 one fit: it is refit from scratch to find the fewest iterations that meet the
                 target (up from --spark-first-iterations while they miss it, by bisection below
                 it when it meets it), and the time to quality is that fit's time. The ratings reach Spark through
                 a Parquet file written before any timing (pyarrow), cached in memory and counted
                 before the first fit; the pyspark venv is EBBFLOW_SPARK_PYTHON (set up by
                 scripts/bench-mf-scale.sh).
--peer libmf:    LIBMF (parallel SGD with adaptive steps, no biases) through the ctypes interface
                 of its Python binding, built from the `libmf` sdist with LIBMF's own Makefile
                 flags (scripts/bench-mf-scale.sh; the library's path in EBBFLOW_LIBMF); its own
                 step size (eta 0.1, its default), ebbflow's rank and L2. LIBMF reports the
                 validation RMSE after each iteration on stdout; the time to the bar is taken
                 when that line arrives, from a child process, so the run stops there.

Trains epoch by epoch until the test RMSE (predictions clipped to the training range) is <= the
target, timing training only. Prints one JSON object: peer, epochs, time_to_quality_s (null if the
target was not reached), quality (final test RMSE), updates_per_s (ratings per training second).
"""
import argparse
import ctypes
import json
import os
import subprocess
import sys
import time

import numpy as np


def load(path, fmt="tsv"):
    if fmt == "f32":
        data = np.fromfile(path, dtype=np.float32).reshape(-1, 3)
    else:
        data = np.loadtxt(path, delimiter="\t", dtype=np.float64, ndmin=2)
    return data[:, 0].astype(np.int64), data[:, 1].astype(np.int64), data[:, 2].astype(np.float32)


class LibmfParameter(ctypes.Structure):
    """LIBMF's `mf_parameter` (mf.h)."""
    _fields_ = [("fun", ctypes.c_int), ("k", ctypes.c_int), ("nr_threads", ctypes.c_int),
                ("nr_bins", ctypes.c_int), ("nr_iters", ctypes.c_int),
                ("lambda_p1", ctypes.c_float), ("lambda_p2", ctypes.c_float),
                ("lambda_q1", ctypes.c_float), ("lambda_q2", ctypes.c_float),
                ("eta", ctypes.c_float), ("do_nmf", ctypes.c_bool), ("quiet", ctypes.c_bool),
                ("copy_data", ctypes.c_bool)]


def libmf_child(args):
    """Trains LIBMF with validation; LIBMF prints `iter tr_rmse va_rmse obj` per iteration."""
    lib = ctypes.CDLL(os.environ["EBBFLOW_LIBMF"])
    lib.train_valid_interface.restype = ctypes.c_void_p
    train = np.ascontiguousarray(np.fromfile(args.train, dtype=np.float32))
    test = np.ascontiguousarray(np.fromfile(args.test, dtype=np.float32))
    param = LibmfParameter(fun=0, k=args.rank, nr_threads=args.threads,
                           nr_bins=max(20, 2 * args.threads + 1), nr_iters=args.max_epochs,
                           lambda_p1=0.0, lambda_p2=args.regularization, lambda_q1=0.0,
                           lambda_q2=args.regularization, eta=0.1, do_nmf=False, quiet=False,
                           copy_data=False)
    pointer = ctypes.POINTER(ctypes.c_float)
    print(f"START {len(train) // 3}", flush=True)
    lib.train_valid_interface(len(train) // 3, len(test) // 3, train.ctypes.data_as(pointer),
                              test.ctypes.data_as(pointer), ctypes.byref(param))
    print("DONE", flush=True)


def run_libmf(args):
    library = os.environ.get("EBBFLOW_LIBMF", "")
    if not os.path.isfile(library):
        raise SystemExit(f"libmf: no built library at EBBFLOW_LIBMF={library!r} "
                         "(scripts/bench-mf-scale.sh builds it from the libmf sdist)")
    child = subprocess.Popen([sys.executable, __file__, "--libmf-child"] + sys.argv[1:],
                             stdout=subprocess.PIPE, text=True)
    start, n, reached, quality, epochs = None, 0, None, None, 0
    for line in child.stdout:
        now = time.perf_counter()
        fields = line.split()
        if fields and fields[0] == "START":
            start, n = now, int(fields[1])
        elif start is not None and len(fields) >= 3 and fields[0].isdigit():
            epochs, quality = int(fields[0]) + 1, float(fields[2])
            print(f"libmf: iteration {epochs}: va_rmse {quality:.4f} at {now - start:.1f} s",
                  file=sys.stderr)
            if quality <= args.target:
                reached = now - start
                break
    elapsed = time.perf_counter() - start if start is not None else None
    child.kill()
    child.wait()
    if start is None or epochs == 0:
        raise SystemExit(f"libmf: the child printed no iteration (exit {child.returncode})")
    return {
        "peer": f"LIBMF 0.9.2 sdist (adaptive SGD, eta 0.1, {args.threads} threads)",
        "epochs": epochs,
        "time_to_quality_s": reached,
        "quality": quality,
        "updates_per_s": n * epochs / elapsed,
    }


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


def run_spark(args):
    import pyarrow as pa
    import pyarrow.parquet as pq
    import pyspark
    from pyspark.ml.recommendation import ALS
    from pyspark.sql import SparkSession, functions as F

    threads = args.threads or 1
    work = os.path.dirname(os.path.abspath(args.train))
    paths = {}
    for name, path in (("train", args.train), ("test", args.test)):
        users, items, ratings = load(path, args.format)
        paths[name] = os.path.join(work, f"{name}.parquet")
        table = pa.table({"user": users.astype(np.int32), "item": items.astype(np.int32),
                          "rating": ratings})
        pq.write_table(table, paths[name])
    spark = (SparkSession.builder.master(f"local[{threads}]").appName("ebbflow-mf-peer")
             .config("spark.driver.memory", args.spark_memory)
             .config("spark.sql.shuffle.partitions", str(max(2 * threads, 4)))
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    spark.sparkContext.setCheckpointDir(os.path.join(work, "spark-checkpoints"))
    train = spark.read.parquet(paths["train"]).repartition(max(2 * threads, 4)).cache()
    test = spark.read.parquet(paths["test"]).cache()
    n = train.count()
    test.count()
    low, high = train.agg(F.min("rating"), F.max("rating")).first()

    def rmse(model):
        predicted = model.transform(test).select(
            F.least(F.greatest(F.col("prediction"), F.lit(low)), F.lit(high)).alias("p"),
            "rating")
        mse = predicted.agg(F.avg((F.col("p") - F.col("rating")) ** 2)).first()[0]
        return float(mse) ** 0.5

    def fit(iterations):
        als = ALS(rank=args.rank, maxIter=iterations, regParam=args.spark_reg, userCol="user",
                  itemCol="item", ratingCol="rating", coldStartStrategy="drop", seed=args.seed,
                  numUserBlocks=max(2 * threads, 4), numItemBlocks=max(2 * threads, 4))
        start = time.perf_counter()
        model = als.fit(train)
        # fit is lazy in places: the factors are materialized before the clock stops
        model.userFactors.count()
        model.itemFactors.count()
        seconds = time.perf_counter() - start
        quality = rmse(model)
        print(f"spark: {iterations} iterations: test rmse {quality:.4f}, fit {seconds:.1f} s",
              file=sys.stderr, flush=True)
        return quality, seconds

    # ALS trains all its iterations in one fit: the fewest iterations that reach the bar are
    # searched by refitting from scratch, upward from --spark-first-iterations while it misses,
    # or by bisection below it when it reaches the bar (a few fits instead of one per count).
    first = max(1, min(args.spark_first_iterations, args.max_epochs))
    iterations = first
    quality, seconds = fit(iterations)
    reached = seconds if quality <= args.target else None
    if reached is not None:
        missed = 0  # the most iterations known to miss the bar
        while iterations - missed > 1:
            middle = (missed + iterations) // 2
            middle_quality, middle_seconds = fit(middle)
            if middle_quality <= args.target:
                iterations, quality, seconds = middle, middle_quality, middle_seconds
                reached = seconds
            else:
                missed = middle
    else:
        while reached is None and iterations < args.max_epochs:
            iterations += 1
            quality, seconds = fit(iterations)
            if quality <= args.target:
                reached = seconds
    spark.stop()
    return {
        "peer": f"Spark MLlib ALS {pyspark.__version__} (local[{threads}], regParam "
                f"{args.spark_reg})",
        "epochs": iterations,
        "time_to_quality_s": reached,
        "quality": quality,
        "updates_per_s": n * iterations / seconds,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--peer", choices=["torch", "surprise", "libmf", "spark"], required=True)
    parser.add_argument("--format", choices=["tsv", "f32"], default="tsv")
    parser.add_argument("--threads", type=int, default=None,
                        help="threads for torch and LIBMF (default: torch's own choice, LIBMF 1)")
    parser.add_argument("--libmf-child", action="store_true", help=argparse.SUPPRESS)
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
    parser.add_argument("--spark-reg", type=float, default=0.02,
                        help="Spark ALS regParam (ALS-WR: scaled by each row's rating count)")
    parser.add_argument("--spark-memory", default="12g", help="Spark driver memory")
    parser.add_argument("--spark-first-iterations", type=int, default=1,
                        help="ALS iterations of the first fit; the search for the fewest that "
                             "reach the bar bisects below it if it does, else goes up")
    args = parser.parse_args()
    if args.libmf_child:
        args.threads = args.threads or 1
        return libmf_child(args)
    if args.peer == "libmf":
        args.threads = args.threads or 1
        result = run_libmf(args)
    elif args.peer == "spark":
        result = run_spark(args)
    else:
        if args.threads:
            import torch
            torch.set_num_threads(args.threads)
        train, test = load(args.train, args.format), load(args.test, args.format)
        result = run_torch(args, train, test) if args.peer == "torch" else run_surprise(args, train, test)
    result["target"] = args.target
    print(json.dumps(result))


if __name__ == "__main__":
    main()
