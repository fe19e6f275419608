"""The linear-probe yardstick of `clef train-head`: how much of a question's answer the stored
hidden states hold, measured by the simplest model that can read it.

Pooling: per record, the final hidden states of every prompt token (the whole prompt: system
text, state, media, questions and options) are pooled three ways and concatenated: the mean over
tokens, the last token, and the elementwise max over tokens (3 x hidden features). Mean and last
carry what is spread out; max keeps a single salient token (one keyword in a long prompt) that
a mean would dilute. Features are standardised with the training fold's mean and standard
deviation (a constant feature gets scale 1), then each question gets a multinomial logistic
regression over its options, fitted by L-BFGS on

    C * sum_i -ln softmax(W x_i + b)[y_i] + ||W||^2 / 2      (C = 1, the bias unpenalised)

which is scikit-learn's `LogisticRegression(C=1)` on `StandardScaler` features.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from scipy.optimize import minimize
from scipy.special import log_softmax

PROBE_C = 1.0


def pooled_features(states: Sequence[torch.Tensor]) -> np.ndarray:
    """`[records, 3 * hidden]` float64: mean, last and max of each record's `[length, hidden]` states."""
    rows = []
    for state in states:
        values = state.double()
        rows.append(torch.cat([values.mean(dim=0), values[-1], values.max(dim=0).values]).numpy())
    return np.stack(rows)


@dataclass(frozen=True)
class Probe:
    """A fitted probe for one question: standardisation and `[K, d]` weights, `[K]` bias."""

    mean: np.ndarray
    scale: np.ndarray
    weights: np.ndarray
    bias: np.ndarray

    def log_probabilities(self, features: np.ndarray) -> np.ndarray:
        scaled = (features - self.mean) / self.scale
        return log_softmax(scaled @ self.weights.T + self.bias, axis=1)


def _objective(params: np.ndarray, x: np.ndarray, onehot: np.ndarray, c: float) -> tuple[float, np.ndarray]:
    classes, width = onehot.shape[1], x.shape[1]
    weights = params[: classes * width].reshape(classes, width)
    bias = params[classes * width :]
    log_p = log_softmax(x @ weights.T + bias, axis=1)
    loss = -c * float((onehot * log_p).sum()) + 0.5 * float((weights**2).sum())
    residual = c * (np.exp(log_p) - onehot)
    gradient = np.concatenate([(residual.T @ x + weights).ravel(), residual.sum(axis=0)])
    return loss, gradient


def fit_probe(features: np.ndarray, targets: np.ndarray, classes: int, c: float = PROBE_C) -> Probe:
    """Standardise `features` and fit the multinomial logistic regression over `classes` options."""
    mean = features.mean(axis=0)
    scale = features.std(axis=0)
    scale[scale < 10 * np.finfo(np.float64).eps * np.maximum(np.abs(mean), 1.0)] = 1.0
    x = (features - mean) / scale
    onehot = np.eye(classes)[targets]
    start = np.zeros(classes * x.shape[1] + classes)
    result = minimize(
        _objective, start, args=(x, onehot, c), jac=True, method="L-BFGS-B",
        options={"maxiter": 2000, "gtol": 1e-8, "ftol": 1e-12},
    )  # fmt: skip
    weights = result.x[: classes * x.shape[1]].reshape(classes, x.shape[1])
    return Probe(mean=mean, scale=scale, weights=weights, bias=result.x[classes * x.shape[1] :])
