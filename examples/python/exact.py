"""The integer-exact app, in Python: every worker adds known integer amounts to known rows each
clock, so the final table is known in closed form. A lost update leaves a value too small, a
doubled one too large; ``evaluate`` counts wrong values. Each clock a worker also checks the SSP
bounds on the rows every worker shares (``loss_sum`` counts violations).

The same app as the runtime's Rust ``exact`` app (runtime/src/exact.rs), written against the
Python SDK; the tests drive both through the same seeded chaos schedules.

    python -m ebbflow runtime local --app python --entry exact:App \
        --app-args '{"clocks": 20}' --clocks 20 --workers 3
"""

import time

import numpy as np

import ebbflow as ef


def amount(worker, clock, table, keys, columns):
    """What ``worker`` adds at ``clock`` to ``table``'s ``keys`` x ``columns``: 1..=5."""
    mixed = worker * 31 + clock * 17 + table * 13 + keys[:, None] * 7 + columns[None, :] * 3
    return (1 + mixed % 5).astype(np.int64)


class App(ef.App):
    def __init__(self, rows=64, width=4, tables=2, shared_rows=4, clocks=10, staleness=0, clock_ms=0):
        self.rows, self.width, self.num_tables = rows, width, tables
        self.shared_rows, self.clocks, self.staleness = shared_rows, clocks, staleness
        self.clock_seconds = clock_ms / 1000.0
        self.num_workers = 1

    def tables(self):
        return [ef.Table(t, f"exact{t}", self.width) for t in range(self.num_tables)]

    def set_num_workers(self, num_workers):
        self.num_workers = num_workers

    def keys_of(self, worker, num_workers):
        keys = np.arange(self.rows, dtype=np.uint64)
        return keys[(keys < self.shared_rows) | (keys % num_workers == worker)]

    def total(self, workers, clocks, table, keys):
        """Sum of the amounts of ``workers`` over ``clocks`` for ``keys`` (rows x columns)."""
        columns = np.arange(self.width)
        keys = keys.astype(np.int64)
        out = np.zeros((len(keys), self.width), dtype=np.int64)
        for clock in clocks:
            for worker in workers:
                out += amount(worker, clock, table, keys, columns)
        return out

    def expected(self, table):
        keys = np.arange(self.rows, dtype=np.int64)
        out = np.zeros((self.rows, self.width), dtype=np.int64)
        for worker in range(self.num_workers):
            mine = (keys < self.shared_rows) | (keys % self.num_workers == worker)
            out[mine] += self.total([worker], range(self.clocks), table, keys[mine])
        return out

    def worker(self, shard, num_shards):
        self.num_workers = num_shards
        return Worker(self, shard, num_shards)

    def evaluate(self, reader):
        wrong, max_error = 0, 0.0
        for table in range(self.num_tables):
            got = reader.get(table, np.arange(self.rows, dtype=np.uint64)).astype(np.int64)
            error = np.abs(got - self.expected(table))
            wrong += int((error != 0).sum())
            max_error = max(max_error, float(error.max()))
        return {"loss": float(wrong), "wrong_values": float(wrong), "max_abs_error": max_error}


class Worker(ef.Worker):
    def __init__(self, app, shard, num_shards):
        self.app, self.shard, self.num_shards = app, shard, num_shards
        self.keys = app.keys_of(shard, num_shards)
        self.shared = self.keys[self.keys < app.shared_rows]
        self.prefixes = {}

    def working_set(self):
        return {table: self.keys for table in range(self.app.num_tables)}

    def prefix(self, who, table, upto):
        """Sum over clocks ``< upto`` of what ``who`` (a worker, or None: every worker) adds to
        the shared rows of ``table``; running sums kept per worker (a pure function, memoised)."""
        sums = self.prefixes.setdefault((who, table), [np.zeros((len(self.shared), self.app.width), np.int64)])
        workers = range(self.num_shards) if who is None else [who]
        while len(sums) <= upto:
            clock = len(sums) - 1
            sums.append(sums[-1] + self.app.total(workers, [clock], table, self.shared))
        return sums[upto]

    def check_reads(self, tables, clock):
        """Failed SSP checks on the shared rows at the start of ``clock``, and checks made."""
        s = self.app.staleness
        complete = max(0, clock - s)
        failed = checks = 0
        for table in range(self.app.num_tables):
            values = tables.get(table, self.shared).astype(np.int64)
            lower = self.prefix(None, table, complete) + (
                self.prefix(self.shard, table, clock) - self.prefix(self.shard, table, complete)
            )
            upper = self.prefix(None, table, clock if s == 0 else clock + s + 1)
            failed += int(((values < lower) | (values > upper)).sum())
            checks += values.size
        return failed, checks

    def clock(self, tables, clock):
        if self.app.clock_seconds:
            time.sleep(self.app.clock_seconds)  # simulated compute, so tests can act mid-run
        failed, checks = self.check_reads(tables, clock)
        columns = np.arange(self.app.width)
        for table in range(self.app.num_tables):
            deltas = amount(self.shard, clock, table, self.keys.astype(np.int64), columns)
            tables.inc(table, self.keys, deltas.astype(np.float32))
        return ef.ClockStats(
            updates=len(self.keys) * self.app.num_tables, loss_sum=float(failed), loss_count=checks
        )
