"""Dense PyTorch models on ebbflow: a model's parameters as rows of one table.

``DenseTable(model)`` flattens ``model.named_parameters()`` into fixed-width rows of a dense
table (zeros-initialised) and back. The table holds each parameter's change from the model's
*initial* values, which every worker and the evaluator rebuild identically (construct the model
after ``torch.manual_seed(seed)``), so torch's own initialisation is kept and the table stays a
pure function of the updates::

    torch.manual_seed(0)
    model = MLP()
    dense = ebbflow.torch.DenseTable(model, table=0)
    # App.tables():           [dense.table_spec()]
    # Worker.working_set():   {0: dense.keys()}
    # Worker.clock(tables, c):
    dense.read(tables)                 # model parameters = initial + rows
    loss = loss_fn(model(x), y); model.zero_grad(); loss.backward()
    dense.add_gradients(tables, lr)    # rows -= lr * gradients (duplicate-free, one inc)

Gradients are computed by torch on whatever device the model is on (a GPU when present).
"""

from __future__ import annotations

import math

import numpy as np
import torch

import ebbflow as ef


class DenseTable:
    """The parameters of ``model`` as rows of ``width`` floats in table ``table``."""

    def __init__(self, model: torch.nn.Module, table: int = 0, width: int = 256, name: str = "params"):
        self.model, self.table, self.width, self.name = model, table, width, name
        self.params = [p for _, p in model.named_parameters() if p.requires_grad]
        self.total = sum(p.numel() for p in self.params)
        self.rows = max(1, math.ceil(self.total / width))
        with torch.no_grad():
            self.initial = torch.cat([p.detach().flatten() for p in self.params]).clone()
        self._keys = np.arange(self.rows, dtype=np.uint64)

    def table_spec(self) -> ef.Table:
        return ef.Table(self.table, self.name, self.width, ef.Zeros())

    def keys(self) -> np.ndarray:
        return self._keys

    def load(self, rows: np.ndarray) -> None:
        """Sets the model's parameters to initial + ``rows`` (shape (rows, width))."""
        flat = torch.from_numpy(np.ascontiguousarray(rows).reshape(-1)[: self.total])
        flat = flat.to(self.initial.device) + self.initial
        offset = 0
        with torch.no_grad():
            for p in self.params:
                n = p.numel()
                p.copy_(flat[offset : offset + n].view_as(p))
                offset += n

    def read(self, tables) -> None:
        """Loads the model from the table (during a clock or an evaluation)."""
        self.load(tables.get(self.table, self._keys))

    def gradient_rows(self) -> np.ndarray:
        """The parameters' gradients as a float32 array of shape (rows, width)."""
        grads = [
            (p.grad if p.grad is not None else torch.zeros_like(p)).detach().flatten()
            for p in self.params
        ]
        flat = torch.cat(grads).to("cpu", torch.float32).numpy()
        out = np.zeros(self.rows * self.width, dtype=np.float32)
        out[: self.total] = flat
        return out.reshape(self.rows, self.width)

    def add_gradients(self, tables, scale: float) -> None:
        """Adds ``-scale * gradients`` to the table (one SGD step; the server-side optimizer may
        turn it into momentum or AdaGrad)."""
        tables.inc(self.table, self._keys, (-scale) * self.gradient_rows())
