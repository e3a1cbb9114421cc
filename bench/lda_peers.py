#!/usr/bin/env python3
"""LDA peers at scale (issue 36), driven by runtime/src/bin/ebbflow-lda-scale.rs.

Trains one peer on the training corpus (LDA-C, 0-based ids) and writes its topics' word
distributions (row-major topics x vocab, float32 little-endian) after each pass or fit to
`--out-dir`, so ebbflow's own held-out evaluator scores every peer the same way. Prints one JSON
line per snapshot: {"peer", "pass", "seconds" (training time so far, snapshots excluded),
"tokens_per_s", "topics_file"}, and a last line {"peer", "done": true}.

- gensim: `LdaMulticore` (online variational Bayes, `--threads` worker processes), one
  `update()` per pass over the corpus, the learning-rate schedule carried on between passes.
- lda: the `lda` package (collapsed Gibbs, Cython, one thread), one fit of `--iterations`
  iterations (it cannot be resumed, so it gives one snapshot).
"""
import argparse
import json
import logging
import os
import sys
import time

import numpy as np


def read_ldac(path):
    docs = []
    with open(path) as stream:
        for line in stream:
            parts = line.split()
            if not parts:
                continue
            docs.append([(int(w), int(c)) for w, c in (p.split(":") for p in parts[1:])])
    return docs


def save(topics, out_dir, name):
    path = os.path.join(out_dir, name)
    np.ascontiguousarray(topics, dtype="<f4").tofile(path)
    return path


def gensim_peer(args, docs, tokens):
    from gensim.models import LdaMulticore

    logging.getLogger("gensim").setLevel(logging.WARNING)
    id2word = {i: str(i) for i in range(args.vocab)}
    model = LdaMulticore(
        corpus=None,
        id2word=id2word,
        num_topics=args.topics,
        workers=args.threads,
        alpha=args.alpha,
        eta=args.eta,
        chunksize=args.chunksize,
        passes=1,
        iterations=args.gensim_iterations,
        eval_every=None,
        random_state=args.seed,
        dtype=np.float32,
    )
    import gensim

    seconds = 0.0
    for number in range(1, args.passes + 1):
        start = time.perf_counter()
        model.update(docs)
        seconds += time.perf_counter() - start
        path = save(model.get_topics(), args.out_dir, f"gensim-{number}.f32")
        print(json.dumps({
            "peer": f"gensim=={gensim.__version__} LdaMulticore",
            "pass": number,
            "seconds": seconds,
            "tokens_per_s": tokens * number / seconds,
            "topics_file": path,
        }), flush=True)


def lda_peer(args, docs, tokens):
    import scipy.sparse

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from lda_peer import fit

    rows, cols, vals = [], [], []
    for d, doc in enumerate(docs):
        for w, c in doc:
            rows.append(d)
            cols.append(w)
            vals.append(c)
    dtm = scipy.sparse.csr_matrix(
        (np.array(vals, dtype=np.int64), (rows, cols)), shape=(len(docs), args.vocab)
    )
    model, seconds = fit(dtm, args.topics, args.iterations, args.alpha, args.eta, args.seed)
    path = save(model.topic_word_, args.out_dir, f"lda-{args.iterations}.f32")
    print(json.dumps({
        "peer": "lda==3.0.2",
        "pass": args.iterations,
        "seconds": seconds,
        "tokens_per_s": tokens * args.iterations / seconds,
        "topics_file": path,
    }), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--peer", required=True, choices=["gensim", "lda"])
    parser.add_argument("--train", required=True, help="LDA-C training corpus")
    parser.add_argument("--vocab", type=int, required=True)
    parser.add_argument("--topics", type=int, required=True)
    parser.add_argument("--alpha", type=float, required=True)
    parser.add_argument("--eta", type=float, required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--passes", type=int, default=10, help="gensim: passes, a snapshot each")
    parser.add_argument("--chunksize", type=int, default=2000, help="gensim: documents a chunk")
    parser.add_argument("--gensim-iterations", type=int, default=50,
                        help="gensim: E-step iterations a document at most")
    parser.add_argument("--iterations", type=int, default=50, help="lda: Gibbs iterations")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out-dir", required=True)
    args = parser.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    docs = read_ldac(args.train)
    tokens = sum(c for doc in docs for _, c in doc)
    print(f"{args.peer}: {len(docs)} documents, {tokens} tokens", file=sys.stderr, flush=True)
    if args.peer == "gensim":
        gensim_peer(args, docs, tokens)
    else:
        lda_peer(args, docs, tokens)
    print(json.dumps({"peer": args.peer, "done": True}), flush=True)


if __name__ == "__main__":
    main()
