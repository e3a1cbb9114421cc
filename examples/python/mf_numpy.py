"""Matrix factorization in numpy on MovieLens 100K: an ebbflow app written in Python.

Each clock a worker takes its slice of a pass over its ratings (a mini-batch), computes the
SGD updates of the batch with numpy, vectorised, and adds them to the user and item rows. Rows
are ``[bias, factors...]`` as in the runtime's Rust MF; the test RMSE bar is the same (<= 0.95).

    EBBFLOW_DATA_DIR=~/.cache/ebbflow/data python -m ebbflow runtime local --app python \
        --entry mf_numpy:App --clocks 240 --workers 2

Arguments (``--app-args`` JSON): ``data`` (a RecBole ``.inter`` file; default
``$EBBFLOW_DATA_DIR/ml-100k.inter``), ``rank`` 32, ``learning_rate`` 0.02, ``regularization``
0.05, ``decay`` 0.9 per pass, ``batch`` 2000 ratings per clock over all workers (a row's
updates within one batch all start from the same values, so ``learning_rate`` x a popular
item's ratings per batch must stay small: 10000 with 0.05 diverges), ``split_seed``
42, ``by_key`` false (use ``get``/``inc`` instead of ``rows``/``slots``: the benchmark compares
them).
"""

import math

import numpy as np

import ebbflow as ef

USERS, ITEMS = 0, 1


def load_inter(path):
    """(user, item, rating) arrays of a RecBole ``.inter`` file (a header, then tab-separated)."""
    data = np.loadtxt(path, skiprows=1, usecols=(0, 1, 2), dtype=np.float64)
    return data[:, 0].astype(np.int64), data[:, 1].astype(np.int64), data[:, 2].astype(np.float32)


class App(ef.App):
    def __init__(
        self,
        data=None,
        rank=32,
        learning_rate=0.02,
        regularization=0.05,
        decay=0.9,
        batch=2000,
        split_seed=42,
        by_key=False,
    ):
        data = data or ef.dataset("ml-100k.inter")
        users, items, ratings = load_inter(data)
        order = np.random.default_rng(split_seed).permutation(len(ratings))
        cut = int(len(order) * 0.8)
        self.train = tuple(a[order[:cut]] for a in (users, items, ratings))
        self.test = tuple(a[order[cut:]] for a in (users, items, ratings))
        self.mean = float(self.train[2].mean())
        self.rank, self.lr, self.reg, self.decay = rank, learning_rate, regularization, decay
        self.batch, self.by_key = batch, by_key

    def tables(self):
        width = self.rank + 1
        return [
            ef.Table(USERS, "users", width, ef.Normal(0.1, seed=1)),
            ef.Table(ITEMS, "items", width, ef.Normal(0.1, seed=2)),
        ]

    def clocks_per_pass(self, workers):
        return max(1, math.ceil(len(self.train[2]) / self.batch))

    def worker(self, shard, num_shards):
        n = len(self.train[2])
        mine = slice(n * shard // num_shards, n * (shard + 1) // num_shards)
        return Worker(self, tuple(a[mine] for a in self.train), self.clocks_per_pass(num_shards))

    def evaluate(self, reader):
        users, items, ratings = self.test
        u = reader.get(USERS, users)
        i = reader.get(ITEMS, items)
        pred = self.mean + u[:, 0] + i[:, 0] + np.einsum("ij,ij->i", u[:, 1:], i[:, 1:])
        rmse = float(np.sqrt(np.mean((ratings - np.clip(pred, 1.0, 5.0)) ** 2)))
        return {"loss": rmse, "rmse": rmse}


def sgd_updates(pu, qi, ratings, mean, lr, reg):
    """The SGD updates of one mini-batch (all from the rows at the batch's start): user rows',
    item rows', and the squared errors."""
    err = ratings - (mean + pu[:, 0] + qi[:, 0] + np.einsum("ij,ij->i", pu[:, 1:], qi[:, 1:]))
    du = np.empty_like(pu)
    dq = np.empty_like(qi)
    du[:, 0] = err - reg * pu[:, 0]
    dq[:, 0] = err - reg * qi[:, 0]
    du[:, 1:] = err[:, None] * qi[:, 1:] - reg * pu[:, 1:]
    dq[:, 1:] = err[:, None] * pu[:, 1:] - reg * qi[:, 1:]
    du *= lr
    dq *= lr
    return du, dq, err


class Worker(ef.Worker):
    def __init__(self, app, shard, clocks_per_pass):
        self.app, self.shard, self.per_pass = app, shard, clocks_per_pass

    def working_set(self):
        users, items, _ = self.shard
        return {USERS: np.unique(users), ITEMS: np.unique(items)}

    def bind(self, tables):
        """Looks the rows up once, and for every slice of a pass the order that groups each row's
        updates (so a clock sums them with one np.add.reduceat instead of np.add.at)."""
        users, items, _ = self.shard
        self.user_slots = tables.slots(USERS, users)
        self.item_slots = tables.slots(ITEMS, items)
        self.groups = []
        for part in range(self.per_pass):
            start, end = ef.pass_slice(len(users), self.per_pass, part)
            self.groups.append(tuple(group(s[start:end]) for s in (self.user_slots, self.item_slots)))

    def clock(self, tables, clock):
        app = self.app
        users, items, ratings = self.shard
        part = clock % self.per_pass
        start, end = ef.pass_slice(len(ratings), self.per_pass, part)
        lr = app.lr * app.decay ** (clock / self.per_pass)
        r = ratings[start:end]
        if app.by_key:
            u, i = users[start:end], items[start:end]
            du, dq, err = sgd_updates(tables.get(USERS, u), tables.get(ITEMS, i), r, app.mean, lr, app.reg)
            tables.inc(USERS, u, du)
            tables.inc(ITEMS, i, dq)
        else:
            us, qs = self.user_slots[start:end], self.item_slots[start:end]
            U, Q = tables.rows(USERS), tables.rows(ITEMS)
            du, dq, err = sgd_updates(U[us], Q[qs], r, app.mean, lr, app.reg)
            for rows, d, (order, starts, unique) in ((U, du, self.groups[part][0]), (Q, dq, self.groups[part][1])):
                if len(d):
                    rows[unique] += np.add.reduceat(d[order], starts, axis=0)
        return ef.ClockStats(len(r), float(np.dot(err, err)), len(r))


def group(slots):
    """(order, starts, unique): ``slots[order]`` runs of equal slots begin at ``starts``."""
    order = np.argsort(slots, kind="stable")
    ordered = slots[order]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]]) if len(ordered) else np.zeros(0, np.int64)
    return order, starts, ordered[starts]
