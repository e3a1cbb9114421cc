"""A Python app that only crosses the boundary: each clock a worker reads and writes ``rows``
rows of width ``width`` (keys 0..rows of one table) by ``get``/``inc``, by ``rows``/``slots``,
or not at all (``mode`` "none": the cost of calling ``clock`` itself). bench/python_sdk.py
subtracts "none" from the others: the time the boundary costs per clock."""

import numpy as np

import ebbflow as ef


class App(ef.App):
    def __init__(self, rows=10000, width=33, mode="get_inc"):
        self.rows, self.width, self.mode = rows, width, mode

    def tables(self):
        return [ef.Table(0, "t", self.width)]

    def worker(self, shard, num_shards):
        return Worker(self)

    def evaluate(self, reader):
        return {"loss": 0.0}


class Worker(ef.Worker):
    def __init__(self, app):
        self.app = app
        self.keys = np.arange(app.rows, dtype=np.uint64)
        self.delta = np.full((app.rows, app.width), 1e-3, dtype=np.float32)

    def working_set(self):
        return {0: self.keys}

    def bind(self, tables):
        self.slots = tables.slots(0, self.keys)

    def clock(self, tables, clock):
        if self.app.mode == "get_inc":
            tables.get(0, self.keys)
            tables.inc(0, self.keys, self.delta)
        elif self.app.mode == "rows":
            rows = tables.rows(0)
            rows[self.slots] += self.delta
        return ef.ClockStats(self.app.rows, 0.0, 0)
