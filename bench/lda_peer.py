#!/usr/bin/env python3
"""LDA peer: the `lda` package (collapsed Gibbs, Cython) on reuters.ldac.

Prints one JSON object: iterations, seconds (fit wall time), tokens_per_s, log_likelihood
(model.loglikelihood(), the complete log p(w, z)), per_token_log_likelihood, and
time_to_quality_s (= seconds: the quality reached after the requested iterations).
Used by scripts/bench.sh and, side by side with ebbflow's sampler, by the runtime's LDA test.
"""
import argparse
import json
import logging
import os
import time

import lda
import lda.utils


def fit(dtm, topics, iterations, alpha, eta, seed):
    """The `lda` package's model fitted on `dtm`, and the fit's wall time in seconds."""
    logging.getLogger("lda").setLevel(logging.WARNING)
    model = lda.LDA(
        n_topics=topics,
        n_iter=iterations,
        alpha=alpha,
        eta=eta,
        random_state=seed,
        # log-likelihood only at the start and the end, so the timing is the sampler's
        refresh=max(iterations, 1),
    )
    start = time.perf_counter()
    model.fit(dtm)
    return model, time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", required=True, help="directory holding reuters.ldac")
    parser.add_argument("--topics", type=int, default=20)
    parser.add_argument("--iterations", type=int, default=1500)
    parser.add_argument("--alpha", type=float, default=0.1)
    parser.add_argument("--eta", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    with open(os.path.join(args.data, "reuters.ldac")) as stream:
        dtm = lda.utils.ldac2dtm(stream, offset=0)
    tokens = int(dtm.sum())
    model, seconds = fit(dtm, args.topics, args.iterations, args.alpha, args.eta, args.seed)
    loglik = float(model.loglikelihood())
    print(json.dumps({
        "peer": "lda==3.0.2",
        "topics": args.topics,
        "iterations": args.iterations,
        "tokens": tokens,
        "seconds": seconds,
        "time_to_quality_s": seconds,
        "tokens_per_s": tokens * args.iterations / seconds,
        "log_likelihood": loglik,
        "per_token_log_likelihood": loglik / tokens,
        "quality": loglik / tokens,
    }))


if __name__ == "__main__":
    main()
