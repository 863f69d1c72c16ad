"""LearnedTermination: a small two-head MLP (torch extra for training, numpy for inference).

Training tuples are snapshots of the training trajectories every H/2 steps
(:func:`~.base.training_tuples`). Inputs per (request, age): log prompt length, log age, the
age in windows, the EmpiricalSurvival forecast at that age (the model learns a correction to the
ECDF) and a one-hot client id (the most frequent training clients, plus "other") where the trace
has clients. A shared trunk feeds two heads:

* termination classifier, ``p_fin = σ(z₁)``, binary cross-entropy on ``[r ≤ H]`` (all tuples);
* conditional-mean regressor, ``mu_rem = 1 + (H − 1)·σ(z₂)``, squared error on ``r`` over the
  tuples with ``r ≤ H`` only, in units of H.

torch is imported only inside :meth:`LearnedTermination.fit`; the fitted weights are numpy
arrays, so predicting needs numpy alone (and is ~50× faster per call than a torch forward).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..workloads.base import Workload
from .base import RequestFeatures, check_horizon, training_tuples
from .survival import EmpiricalSurvival

__all__ = ["LearnedTermination"]

_BLOCK_ROWS = 32


@dataclass(frozen=True, slots=True, eq=False)
class LearnedTermination:
    """Fitted two-head MLP for one horizon ``H`` (``predict`` rejects another H).

    ``weights``: ``[(W, b), …]`` of the trunk then the two heads (numpy, float32);
    ``mean``/``scale`` standardise the inputs; ``clients`` are the one-hot client ids.
    """

    horizon: int
    weights: tuple[tuple[NDArray[np.float32], NDArray[np.float32]], ...]
    mean: NDArray[np.float32]
    scale: NDArray[np.float32]
    clients: NDArray[np.int64]
    survival: EmpiricalSurvival
    name: str = "learned"

    @classmethod
    def fit(
        cls,
        train: Workload,
        *,
        horizon: int = 80,
        seed: int = 0,
        hidden: int = 64,
        steps: int = 500,
        batch: int = 1024,
        lr: float = 3e-3,
        max_tuples: int = 200_000,
        max_clients: int = 32,
    ) -> LearnedTermination:
        """Train on ``train``'s trajectories sampled every H/2 steps (seeded, CPU, seconds).

        Weights are initialised and batches drawn from ``np.random.default_rng(seed)``; torch's
        global generator is never used. Training runs on one intra-op thread (restored after):
        the model is tiny, and extra threads only contend (40× slower on a busy 2-core host).
        ``steps`` Adam steps of ``batch`` tuples, at most ``max_tuples`` tuples, one-hot of the
        ``max_clients`` most frequent clients.
        """
        import torch

        horizon = check_horizon(horizon)
        rng = np.random.default_rng(seed)
        tuples = training_tuples(train, horizon, max_tuples=max_tuples, rng=rng)
        survival = EmpiricalSurvival.from_lengths(train.output_len)
        clients = np.zeros(0, dtype=np.int64)
        if train.client is not None:
            ids, counts = np.unique(train.client, return_counts=True)
            clients = np.sort(ids[np.argsort(-counts, kind="stable")[:max_clients]])
        feats = RequestFeatures.from_workload(train).take(tuples.row)
        x = _inputs(feats, tuples.age, horizon, survival, clients)
        mean = x.mean(axis=0)
        scale = np.where(x.std(axis=0) > 1e-6, x.std(axis=0), 1.0)
        x = ((x - mean) / scale).astype(np.float32)
        target = (np.clip(tuples.remaining, 1, horizon) - 1.0) / max(horizon - 1, 1)

        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            weights = _train(
                torch, x, tuples.finished.astype(np.float32), target.astype(np.float32), rng,
                hidden=hidden, steps=steps, batch=batch, lr=lr,
            )
        finally:
            torch.set_num_threads(threads)
        return cls(
            horizon=horizon, weights=weights, mean=mean.astype(np.float32),
            scale=scale.astype(np.float32), clients=clients, survival=survival,
        )

    def predict(
        self, features: RequestFeatures, ages: NDArray, horizon: int
    ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """Forward pass in numpy (two 64-wide ReLU layers and the two heads)."""
        horizon = check_horizon(horizon)
        if horizon != self.horizon:
            raise ValueError(f"this model was trained for H={self.horizon}, not {horizon=}")
        x = (_inputs(features, np.asarray(ages), horizon, self.survival, self.clients) - self.mean) / self.scale
        z = np.empty((x.shape[0], 2), dtype=np.float32)
        (wp, bp), (wm, bm) = self.weights[2:]
        head = np.concatenate([wp, wm], axis=1)
        bias = np.concatenate([bp, bm])
        # row blocks keep every product below OpenBLAS's threading threshold: on a busy host
        # its threads make these tiny products ~30× slower than one core does
        for lo in range(0, x.shape[0], _BLOCK_ROWS):
            h = x[lo : lo + _BLOCK_ROWS].astype(np.float32)
            for w, b in self.weights[:2]:
                h = np.maximum(h @ w + b, 0.0)
            z[lo : lo + _BLOCK_ROWS] = h @ head + bias
        p_fin = _sigmoid(z[:, 0])
        mu_rem = 1.0 + (horizon - 1) * _sigmoid(z[:, 1])
        return p_fin, mu_rem


def _train(
    torch: Any,
    x: NDArray[np.float32],
    finished: NDArray[np.float32],
    target: NDArray[np.float32],
    rng: np.random.Generator,
    *,
    hidden: int,
    steps: int,
    batch: int,
    lr: float,
) -> tuple[tuple[NDArray[np.float32], NDArray[np.float32]], ...]:
    """Adam on ``BCE(z₁, finished) + MSE(σ(z₂), target | finished)``; returns numpy weights
    ``[(W, b)]`` of trunk layer 1, trunk layer 2, classifier head, regressor head."""
    params = []
    for fan_in, fan_out in ((x.shape[1], hidden), (hidden, hidden), (hidden, 1), (hidden, 1)):
        bound = 1.0 / np.sqrt(fan_in)  # PyTorch's default Linear init, drawn from ``rng``
        w = rng.uniform(-bound, bound, (fan_in, fan_out))
        b = rng.uniform(-bound, bound, fan_out)
        params += [torch.tensor(w, dtype=torch.float32, requires_grad=True),
                   torch.tensor(b, dtype=torch.float32, requires_grad=True)]
    opt = torch.optim.Adam(params, lr=lr)
    xt, yt, tt = torch.from_numpy(x), torch.from_numpy(finished), torch.from_numpy(target)
    bce = torch.nn.BCEWithLogitsLoss()
    w1, b1, w2, b2, wp, bp, wm, bm = params
    for _ in range(steps):
        idx = torch.from_numpy(rng.integers(0, x.shape[0], size=min(batch, x.shape[0])))
        h = torch.relu(torch.relu(xt[idx] @ w1 + b1) @ w2 + b2)
        y = yt[idx]
        loss = bce((h @ wp + bp).squeeze(1), y)
        pos = y > 0.5
        if bool(pos.any()):  # the regressor sees only requests that do end within H
            reg = torch.sigmoid(h @ wm + bm).squeeze(1)
            loss = loss + torch.mean((reg[pos] - tt[idx][pos]) ** 2)
        opt.zero_grad()
        loss.backward()
        opt.step()
    arrays = [p.detach().numpy().astype(np.float32) for p in params]
    return tuple((arrays[i], arrays[i + 1]) for i in range(0, len(arrays), 2))


def _sigmoid(z: NDArray) -> NDArray[np.float64]:
    return 1.0 / (1.0 + np.exp(-np.clip(z.astype(np.float64), -50.0, 50.0)))


def _inputs(
    features: RequestFeatures,
    ages: NDArray,
    horizon: int,
    survival: EmpiricalSurvival,
    clients: NDArray[np.int64],
) -> NDArray[np.float64]:
    """The model's input rows: log s, log(1 + a), a/H, ECDF p_fin and mu_rem/H, client one-hot."""
    a = np.asarray(ages, dtype=np.float64)
    p_s, mu_s = survival.predict(features, a.astype(np.int64), horizon)
    cols = [
        np.log1p(features.prompt_len.astype(np.float64)),
        np.log1p(a),
        a / horizon,
        p_s,
        mu_s / horizon,
    ]
    x = np.stack(cols, axis=1)
    if clients.shape[0]:
        onehot = np.zeros((a.shape[0], clients.shape[0] + 1))
        if features.client is not None:
            pos = np.minimum(np.searchsorted(clients, features.client), clients.shape[0] - 1)
            known = clients[pos] == features.client
            onehot[np.flatnonzero(known), pos[known]] = 1.0
            onehot[~known, -1] = 1.0
        else:
            onehot[:, -1] = 1.0
        x = np.concatenate([x, onehot], axis=1)
    return x
