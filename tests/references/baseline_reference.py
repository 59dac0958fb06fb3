"""NumPy reference of the local-update baselines of MATH.md §6, in float64.

Written from docs/MATH.md (§3, §4 and the table of §6), not from the
package: M workers each take AdamW steps on their own gradient; at the end of every
step t with t % K_x == 0 the pseudo-gradients are averaged and the outer step taken;
the first moments are averaged when t % K_u == 0 and the second when t % K_v == 0
(never, for a period of None).

* Local Adam: K_u = K_v = K_x, outer step the identity (theta = mean of workers).
* DES-LOC: K_u = 3 K_x, K_v = 6 K_x by default.
* DiLoCo: moments never averaged; outer SGD, learning rate 0.7, momentum 0.9,
  Nesterov, on the averaged pseudo-gradient Delta, with momentum buffer b:
  b = momentum * b + Delta, theta = anchor - lr * (Delta + momentum * b)
  (Sutskever's Nesterov form, as PyTorch and optax write it).

Params are dicts of arrays; ``grad_fn(params, batch)`` returns a dict like them.
"""

from __future__ import annotations

import numpy as np


def adamw_step(theta, g, u, v, t, *, lr, b1, b2, eps, weight_decay):
  """One AdamW step on one array (bias-corrected, decoupled weight decay)."""
  u = b1 * u + (1 - b1) * g
  v = b2 * v + (1 - b2) * g**2
  u_hat = u / (1 - b1**t)
  v_hat = v / (1 - b2**t)
  theta = theta - lr * (u_hat / (np.sqrt(v_hat) + eps) + weight_decay * theta)
  return theta, u, v


def _mean(trees):
  return {k: np.mean([tree[k] for tree in trees], axis=0) for k in trees[0]}


def local_adamw(
  params,
  grad_fn,
  batches,
  *,
  num_workers: int,
  lr: float,
  sync_every: int,
  first_moment_every: int | None,
  second_moment_every: int | None,
  outer: tuple[float, float, bool] | None = None,
  b1: float = 0.9,
  b2: float = 0.999,
  eps: float = 1e-8,
  weight_decay: float = 0.0,
):
  """Runs ``len(batches)`` steps; ``batches[t][m]`` is worker m's batch at step t + 1.

  Args:
    params: the initial params (dict of arrays), the same on every worker.
    grad_fn: ``(params, batch) -> grads``.
    batches: per step, a list of M per-worker batches.
    num_workers: M.
    lr: the local AdamW learning rate.
    sync_every: K_x, steps between parameter averages.
    first_moment_every: K_u in steps (a multiple of K_x), or None (never).
    second_moment_every: K_v in steps, or None.
    outer: None (theta = anchor - Delta, the plain average), or
      (learning rate, momentum, nesterov) of the outer SGD.
    b1, b2, eps, weight_decay: AdamW's.

  Returns:
    A list, per step, of the M per-worker params after that step.
  """
  f64 = lambda tree: {k: np.asarray(x, np.float64) for k, x in tree.items()}  # noqa: E731
  theta = [f64(params) for _ in range(num_workers)]
  u = [{k: np.zeros_like(x) for k, x in p.items()} for p in theta]
  v = [{k: np.zeros_like(x) for k, x in p.items()} for p in theta]
  anchor = f64(params)
  buffer = {k: np.zeros_like(x) for k, x in anchor.items()}
  history = []
  for t, step_batches in enumerate(batches, start=1):
    for m in range(num_workers):
      g = grad_fn(theta[m], step_batches[m])
      for k in theta[m]:
        theta[m][k], u[m][k], v[m][k] = adamw_step(
          theta[m][k],
          g[k],
          u[m][k],
          v[m][k],
          t,
          lr=lr,
          b1=b1,
          b2=b2,
          eps=eps,
          weight_decay=weight_decay,
        )
    if t % sync_every == 0:
      delta = _mean([{k: anchor[k] - p[k] for k in anchor} for p in theta])
      if outer is None:
        synced = {k: anchor[k] - delta[k] for k in anchor}
      else:
        outer_lr, momentum, nesterov = outer
        buffer = {k: momentum * buffer[k] + delta[k] for k in anchor}
        direction = {k: delta[k] + momentum * buffer[k] if nesterov else buffer[k] for k in anchor}
        synced = {k: anchor[k] - outer_lr * direction[k] for k in anchor}
      anchor = synced
      theta = [dict(synced) for _ in range(num_workers)]
      if first_moment_every is not None and t % first_moment_every == 0:
        u = [_mean(u) for _ in range(num_workers)]
      if second_moment_every is not None and t % second_moment_every == 0:
        v = [_mean(v) for _ in range(num_workers)]
    history.append([{k: x.copy() for k, x in p.items()} for p in theta])
  return history
