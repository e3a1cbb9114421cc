"""A two-layer MLP in PyTorch on the digits data set: an ebbflow app whose gradients come from
torch autograd (on a GPU when one is present).

Each clock is one SGD step on a global mini-batch of ``batch`` examples split across the
workers; every worker adds its part of the gradient (scaled by its share), so the workers' sum
is the one-worker step. The model is rebuilt from the table every clock (``DenseTable``).
Quality bar: test accuracy >= 0.95 (the Rust MLR's on the same data reaches 0.958).

    EBBFLOW_DATA_DIR=~/.cache/ebbflow/data python -m ebbflow runtime local --app python \
        --entry mlp_torch:App --clocks 400 --workers 2

Arguments: ``data`` (default ``$EBBFLOW_DATA_DIR/digits.csv.gz``), ``hidden`` 64,
``learning_rate`` 0.5, ``batch`` 64, ``split_seed`` 42, ``seed`` 0, ``device`` ("cpu", "cuda"
or "auto": the GPU when torch sees one).
"""

import math

import numpy as np
import torch

import ebbflow as ef
from ebbflow.torch import DenseTable


def load_digits(path):
    data = np.loadtxt(path, delimiter=",", dtype=np.float32)
    return data[:, :-1] / 16.0, data[:, -1].astype(np.int64)


def build_model(hidden, seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(64, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 10)
    )


def pick_device(device):
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


class App(ef.App):
    def __init__(self, data=None, hidden=64, learning_rate=0.5, batch=64, split_seed=42, seed=0, device="cpu"):
        data = data or ef.dataset("digits.csv.gz")
        x, y = load_digits(data)
        order = np.random.default_rng(split_seed).permutation(len(y))
        cut = int(len(y) * 0.8)
        self.train = (x[order[:cut]], y[order[:cut]])
        self.test = (x[order[cut:]], y[order[cut:]])
        self.hidden, self.lr, self.batch, self.seed = hidden, learning_rate, batch, seed
        self.device = pick_device(device)
        self.dense = DenseTable(build_model(hidden, seed).to(self.device), table=0, width=64)

    def tables(self):
        return [self.dense.table_spec()]

    def clocks_per_pass(self, workers):
        return max(1, math.ceil(len(self.train[1]) / self.batch))

    def worker(self, shard, num_shards):
        n = len(self.train[1])
        mine = slice(n * shard // num_shards, n * (shard + 1) // num_shards)
        return Worker(self, self.train[0][mine], self.train[1][mine], num_shards)

    def evaluate(self, reader):
        self.dense.read(reader)
        x, y = (torch.from_numpy(a).to(self.device) for a in self.test)
        with torch.no_grad():
            logits = self.dense.model(x)
            loss = torch.nn.functional.cross_entropy(logits, y).item()
            accuracy = (logits.argmax(1) == y).float().mean().item()
        return {"loss": loss, "accuracy": accuracy}


class Worker(ef.Worker):
    def __init__(self, app, x, y, num_shards):
        self.app, self.num_shards = app, num_shards
        self.x = torch.from_numpy(x).to(app.device)
        self.y = torch.from_numpy(y).to(app.device)
        self.dense = DenseTable(build_model(app.hidden, app.seed).to(app.device), table=0, width=64)
        self.per_pass = app.clocks_per_pass(num_shards)

    def working_set(self):
        return {0: self.dense.keys()}

    def clock(self, tables, clock):
        # This worker's part of the global batch of the clock, in a per-pass shuffled order.
        n = len(self.y)
        epoch, part = divmod(clock, self.per_pass)
        order = np.random.default_rng([self.app.seed, epoch]).permutation(n)
        start, end = ef.pass_slice(n, self.per_pass, part)
        batch = torch.from_numpy(order[start:end]).to(self.app.device)
        if len(batch) == 0:
            return ef.ClockStats()
        self.dense.read(tables)
        model = self.dense.model
        model.zero_grad()
        losses = torch.nn.functional.cross_entropy(model(self.x[batch]), self.y[batch], reduction="none")
        # Sum of per-example gradients over the global batch size: the workers' parts add up to
        # one step on the global mini-batch.
        (losses.sum() / self.app.batch).backward()
        self.dense.add_gradients(tables, self.app.lr)
        return ef.ClockStats(len(batch), float(losses.sum().item()), len(batch))
