#!/usr/bin/env python3
"""train_mlp: train a small MLP in FP8 with libte from Python, and check it against FP32.

The Python twin of examples/c/train_mlp.c:

  model   Linear(64 -> 256) -> GELU -> Linear(256 -> 16), MSE loss
  task    regress the outputs of a fixed random "teacher" MLP on Gaussian inputs
  optim   SGD with momentum on fp32 master weights kept here, in NumPy

The model is trained twice from the same initial weights on the same batches: once with every
forward inside an FP8 autocast scope (delayed scaling, HYBRID: E4M3 forward, E5M2 gradients),
once with the scope disabled, so the only difference between the loss curves is FP8.

Usage:  LIBTE_PATH=build/release python3 examples/python/train_mlp.py [--steps N] [--csv FILE]
Exit:   0  FP8 converged: final loss far below the initial loss and within 10% of FP32's
        1  it did not
        2  a libte call failed
"""

import argparse
import os
import sys

import numpy as np

import libte

IN, HIDDEN, OUT, BATCH = 64, 256, 16, 128  # FP8 GEMMs want every dimension a multiple of 16
STEPS, LOG_EVERY, FINAL_WINDOW = 600, 50, 20
LEARNING_RATE, MOMENTUM = 0.5, 0.9
CONVERGED_FRACTION = 0.1  # final loss at most this fraction of the initial loss...
FP8_TOLERANCE = 0.10      # ...and FP8's final loss within this relative distance of FP32's
TEACHER_SEED, INIT_SEED, DATA_SEED = 1, 2, 3


class SplitMix64:
    """The C demo's generator (splitmix64 + Box-Muller), vectorised: call k of a stream is
    mix(state + k * gamma), so n calls are one NumPy expression."""

    GAMMA = np.uint64(0x9E3779B97F4A7C15)

    def __init__(self, seed):
        self.state = np.uint64(seed)

    def _next(self, n):
        with np.errstate(over="ignore"):
            z = self.state + np.arange(1, n + 1, dtype=np.uint64) * self.GAMMA
            self.state = self.state + np.uint64(n) * self.GAMMA
            z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
            z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
            return z ^ (z >> np.uint64(31))

    def normal(self, shape, stddev):
        n = int(np.prod(shape))
        bits = self._next(2 * n).reshape(n, 2)
        u = ((bits >> np.uint64(11)).astype(np.float64) + 1.0) * 2.0 ** -53  # in (0, 1]
        z = stddev * np.sqrt(-2.0 * np.log(u[:, 0])) * np.cos(6.283185307179586 * u[:, 1])
        return z.astype(np.float32).reshape(shape)


def gelu(x):
    """Same tanh approximation as libte's GELU."""
    return 0.5 * x * (1.0 + np.tanh(0.7978845608028654 * (x + 0.044715 * x ** 3)))


class Teacher:
    """A fixed random MLP of the same shape, in plain fp32 NumPy, never through libte."""

    def __init__(self, seed):
        r = SplitMix64(seed)
        self.w1 = r.normal((IN, HIDDEN), 1.0 / np.sqrt(IN))
        self.w2 = r.normal((HIDDEN, OUT), 1.0 / np.sqrt(HIDDEN))

    def __call__(self, x):
        return (gelu(x @ self.w1) @ self.w2).astype(np.float32)


def init_params(seed):
    r = SplitMix64(seed)
    return {"w1": r.normal((HIDDEN, IN), 1.0 / np.sqrt(IN)), "b1": np.zeros(HIDDEN, np.float32),
            "w2": r.normal((OUT, HIDDEN), 1.0 / np.sqrt(HIDDEN)),
            "b2": np.zeros(OUT, np.float32)}


def train(ctx, recipe, use_fp8, init, teacher, steps):
    """Losses per step (before each update); fresh layers, so no FP8 history carries over."""
    fc1 = libte.Linear(ctx, IN, HIDDEN, dtype="float32")  # F32 in both runs: FP8 is the only
    fc2 = libte.Linear(ctx, HIDDEN, OUT, dtype="float32")  # difference between them
    params = {k: v.copy() for k, v in init.items()}
    grads = {k: np.zeros_like(v) for k, v in init.items()}
    velocity = {k: np.zeros_like(v) for k, v in init.items()}
    h = np.empty((BATCH, HIDDEN), np.float32)
    a = np.empty((BATCH, HIDDEN), np.float32)
    y = np.empty((BATCH, OUT), np.float32)
    da = np.empty((BATCH, HIDDEN), np.float32)
    dh = np.empty((BATCH, HIDDEN), np.float32)
    # Options fixed once: entering the scope is one C call per step.
    scope = libte.autocast(ctx, enabled=use_fp8, recipe=recipe)
    data = SplitMix64(DATA_SEED)  # both runs replay the same batches
    losses = np.empty(steps)
    for step in range(steps):
        x = data.normal((BATCH, IN), 1.0)
        target = teacher(x)
        # When the scope ends, libte updates the forward scales from this step's amaxes.
        with scope:
            _, bwd1 = fc1.forward(x, params["w1"], params["b1"], out=h)
            libte.activation_forward(ctx, "gelu", h, out=a)
            _, bwd2 = fc2.forward(a, params["w2"], params["b2"], out=y)
        diff = y - target
        losses[step] = float(np.mean(diff.astype(np.float64) ** 2))
        dy = (2.0 * diff / diff.size).astype(np.float32)
        # Backward after the scope, as in TE; fc1 (the pass's first FP8 module) needs no dx,
        # and its backward makes libte update the gradient scales.
        bwd2.backward(dy, dx=da, dw=grads["w2"], db=grads["b2"], once=True)
        libte.activation_backward(ctx, "gelu", h, da, out=dh)
        bwd1.backward(dh, dx=False, dw=grads["w1"], db=grads["b1"], once=True)
        bwd2.close()
        bwd1.close()
        for k in params:  # fp32 master weights; FP8 is only a per-step copy inside libte
            velocity[k] *= MOMENTUM
            velocity[k] += grads[k]
            params[k] -= LEARNING_RATE * velocity[k]
    fc1.close()
    fc2.close()
    return losses


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--csv", help="write step,loss_fp8,loss_fp32 here")
    args = parser.parse_args(argv)
    steps = max(args.steps, FINAL_WINDOW)

    try:
        with libte.Context("cpu") as ctx:
            # A 16-step amax window lets delayed scaling follow the shrinking gradients of a run
            # this short (TE's default, 1024, is longer than the whole run); see the C demo.
            recipe = libte.Recipe(kind="delayed", fp8_format="HYBRID", amax_history_len=16)
            teacher = Teacher(TEACHER_SEED)
            init = init_params(INIT_SEED)
            print("libte %s (%s backend), CPU context" % (libte.version(), libte.BACKEND))
            print("MLP %d -> %d -> GELU -> %d, batch %d, %d steps, SGD lr %g momentum %g"
                  % (IN, HIDDEN, OUT, BATCH, steps, LEARNING_RATE, MOMENTUM))
            print("fp8 recipe: %s" % recipe.describe)
            loss_fp8 = train(ctx, recipe, True, init, teacher, steps)
            loss_fp32 = train(ctx, recipe, False, init, teacher, steps)
    except libte.Error as e:
        print("libte call failed: %s: %s" % (type(e).__name__, e), file=sys.stderr)
        return 2

    for step in range(steps):
        if step % LOG_EVERY == 0 or step == steps - 1:
            print("step %4d  fp8 %.5f  fp32 %.5f" % (step, loss_fp8[step], loss_fp32[step]))
    initial = loss_fp32[0]
    final_fp8 = float(np.mean(loss_fp8[-FINAL_WINDOW:]))
    final_fp32 = float(np.mean(loss_fp32[-FINAL_WINDOW:]))
    ratio = final_fp8 / final_fp32
    converged = final_fp8 <= CONVERGED_FRACTION * initial  # False for NaN
    within = abs(ratio - 1.0) <= FP8_TOLERANCE
    if not converged:
        print("fp8 did not converge: final loss %.5f is not below %g x the initial %.5f"
              % (final_fp8, CONVERGED_FRACTION, initial))
    print("final loss: fp8 %.5f fp32 %.5f (fp8/fp32 = %.3f, within %.0f%%: %s; initial %.5f)"
          % (final_fp8, final_fp32, ratio, 100 * FP8_TOLERANCE, "yes" if within else "no",
             initial))
    if args.csv:
        with open(args.csv, "w") as f:
            f.write("step,loss_fp8,loss_fp32\n")
            for i in range(steps):
                f.write("%d,%.9g,%.9g\n" % (i, loss_fp8[i], loss_fp32[i]))
        print("loss curves written to %s" % os.path.abspath(args.csv))
    return 0 if converged and within else 1


if __name__ == "__main__":
    sys.exit(main())
