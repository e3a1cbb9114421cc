"""ebbflow: train your own model on revocable cloud capacity.

A model is an *app*: the runtime owns the training loop and calls your hooks, so it can move
your workers to other machines, copy the parameters to reliable servers and roll back after a
failure without your code noticing. Write two classes::

    import numpy as np
    import ebbflow as ef

    class App(ef.App):                                   # entry "mymodel:App"
        def __init__(self, **args): ...                  # args: the job's app arguments
        def tables(self):
            return [ef.Table(0, "weights", width=16, init=ef.Normal(0.01, seed=1))]
        def worker(self, shard, num_shards):
            return Worker(self, shard, num_shards)
        def evaluate(self, reader):                      # reader.get(table, keys)
            return {"loss": ...}

    class Worker(ef.Worker):
        def working_set(self):                           # once: {table id: keys}
            return {0: np.arange(100)}
        def clock(self, tables, clock):                  # a pure function of (shard, clock, rows)
            rows = tables.get(0, keys)                   # float32 (len(keys), 16)
            tables.inc(0, keys, -lr * grad)              # duplicate keys add up
            return ef.ClockStats(updates=n, loss_sum=..., loss_count=n)

The rule that makes migration and rollback exact: ``clock(tables, c)`` depends only on the
shard, ``c`` and the rows it reads, and every learned value lives in a table (a worker keeps
no state that changes from one clock to the next). See docs/python.md.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import ClassVar

__all__ = [
    "App",
    "ClockStats",
    "Normal",
    "Table",
    "Uniform",
    "Worker",
    "Zeros",
    "dataset",
    "pass_slice",
    "run_local",
]


@dataclass(frozen=True)
class Zeros:
    """Rows start at zero."""

    kind: ClassVar[str] = "zeros"


@dataclass(frozen=True)
class Uniform:
    """Rows start uniform in [low, high), a pure function of (seed, table, key, column)."""

    low: float
    high: float
    seed: int = 0
    kind: ClassVar[str] = "uniform"


@dataclass(frozen=True)
class Normal:
    """Rows start normal with mean 0 and standard deviation ``std``, seeded like Uniform."""

    std: float
    seed: int = 0
    kind: ClassVar[str] = "normal"


@dataclass(frozen=True)
class Table:
    """A parameter table: float32 rows of ``width`` values keyed by non-negative integers."""

    id: int
    name: str
    width: int
    init: Zeros | Uniform | Normal = field(default_factory=Zeros)


@dataclass
class ClockStats:
    """What one worker did in one clock: units of work, and the training loss terms seen."""

    updates: int = 0
    loss_sum: float = 0.0
    loss_count: int = 0


class App:
    """Base class of an app (optional: any class with these methods works)."""

    def tables(self) -> list[Table]:
        raise NotImplementedError

    def worker(self, shard: int, num_shards: int) -> "Worker":
        raise NotImplementedError

    def evaluate(self, reader) -> dict[str, float]:
        raise NotImplementedError

    def clocks_per_pass(self, workers: int) -> int:
        """Clocks one pass over the data takes with ``workers`` workers (a clock may be a slice
        of a pass, so that many workers' summed updates stay as small as one's)."""
        return 1


class Worker:
    """Base class of a worker: one data shard, one clock of work at a time."""

    def working_set(self) -> dict:
        raise NotImplementedError

    def clock(self, tables, clock: int) -> ClockStats:
        raise NotImplementedError


def dataset(default_name: str) -> str:
    """The job's dataset: ``EBBFLOW_DATASET`` (``spec.app.dataset`` of a TrainingJob), else
    ``default_name`` in the data directory ``EBBFLOW_DATA_DIR`` (scripts/fetch-data.sh)."""
    path = os.environ.get("EBBFLOW_DATASET")
    if path:
        return path
    base = os.environ.get("EBBFLOW_DATA_DIR")
    if not base:
        raise ValueError("no dataset: set EBBFLOW_DATA_DIR (scripts/fetch-data.sh) or pass data")
    return os.path.join(base, default_name)


def pass_slice(length: int, clocks_per_pass: int, clock: int) -> tuple[int, int]:
    """The ``[start, end)`` of ``length`` items that clock ``clock`` covers when a pass takes
    ``clocks_per_pass`` clocks (the same split as the runtime's built-in apps)."""
    clocks_per_pass = max(1, clocks_per_pass)
    part = clock % clocks_per_pass
    return (length * part // clocks_per_pass, length * (part + 1) // clocks_per_pass)


def run_local(
    entry: str,
    args: dict | None = None,
    *,
    workers: int = 1,
    clocks: int = 10,
    staleness: int = 0,
    partitions: int = 4,
    optimizer: str = "add",
) -> dict:
    """Trains the app ``entry`` (``module:Class``) in this process and returns the run report."""
    from . import _core

    report = _core.run_local(
        entry,
        None if args is None else json.dumps(args),
        workers,
        clocks,
        staleness,
        partitions,
        optimizer,
    )
    return json.loads(report)
