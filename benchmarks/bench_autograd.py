"""asv suites for autograd, nn and optim.

* ``ApplyOverhead``: what ``Function.apply`` costs on plain arrays beyond
  the kernel it runs (a serial 16-element relu, so the kernel is
  negligible), beside the direct kernel call; the target is under 5 us.
  Also an nbops operator called through ``Operator.__call__`` and through
  its front function (the cost of the routing alone).
* ``MLPStep``: one training step of a 784-512-512-10 ReLU MLP, batch 256,
  float32 (forward, cross-entropy, backward, Adam update) with nbops
  (modules, tape, fused optimizer), beside the same step written by hand in
  NumPy in the same run.

``python benchmarks/bench_autograd.py`` prints both comparisons (medians).
"""

import time

import numpy as np


def _import():
    try:
        import nbops
        from nbops import autograd, nn, optim  # noqa: F401
    except ImportError as exc:  # an older commit without autograd
        raise NotImplementedError(str(exc)) from None
    return nbops


class ApplyOverhead:
    """Per-call overhead on plain arrays (timings in seconds per call)."""

    def setup(self):
        nbops = _import()
        from numba import njit

        self.x = np.linspace(-1, 1, 16).astype(np.float32)
        self.out = np.empty_like(self.x)

        # a serial kernel: the thread pool's wake-up would drown the overhead
        @njit(nogil=True)
        def kernel(x, out):
            for i in range(x.size):
                out[i] = x[i] if x[i] > 0 else 0
            return out

        self.direct = kernel
        direct = self.direct

        class Relu(nbops.autograd.Function):
            @staticmethod
            def forward(ctx, x, out):
                return direct(x, out)

            @staticmethod
            def backward(ctx, g):
                return g, None

        self.relu_fn = Relu
        self.relu_op = nbops.relu
        for _ in range(3):
            self.time_direct_kernel()
            self.time_function_apply()
            self.time_operator_call()

    def time_direct_kernel(self):
        self.direct(self.x, self.out)

    def time_function_apply(self):
        self.relu_fn.apply(self.x, self.out)

    def time_operator_call(self):
        self.relu_op(self.x, out=self.out)

    def time_operator_front(self):
        self.relu_op.front(self.x, out=self.out)


class MLPStep:
    """One training step, 784-512-512-10, batch 256, float32."""

    params = [["nbops", "numpy"]]
    param_names = ["impl"]
    timeout = 300

    def setup(self, impl):
        nbops = _import()
        nbops.set_num_threads(min(2, nbops.get_num_threads()))
        rng = np.random.default_rng(0)
        self.x = rng.standard_normal((256, 784)).astype(np.float32)
        self.y = rng.integers(0, 10, 256)
        self.step = (_nbops_step if impl == "nbops" else _numpy_step)(nbops, self.x, self.y)
        for _ in range(3):       # compile, tune, warm the caches
            self.step()

    def time_step(self, impl):
        self.step()


SIZES = (784, 512, 512, 10)


def _init(rng, n_in, n_out):
    bound = 1.0 / np.sqrt(n_in)
    return (rng.uniform(-bound, bound, (n_out, n_in)).astype(np.float32),
            rng.uniform(-bound, bound, n_out).astype(np.float32))


def _nbops_step(nbops, x, y):
    from nbops import nn

    rng = np.random.default_rng(1)
    layers = []
    for n_in, n_out in zip(SIZES[:-1], SIZES[1:]):
        layer = nn.Linear(n_in, n_out)
        layer.weight.data, layer.bias.data = _init(rng, n_in, n_out)
        layers += [layer, nn.ReLU()]
    model = nn.Sequential(*layers[:-1])
    opt = nbops.optim.Adam(model.parameters(), lr=1e-3)

    def step():
        loss = nn.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    return step


def _numpy_step(nbops, x, y, lr=1e-3, b1=0.9, b2=0.999, eps=1e-8):
    rng = np.random.default_rng(1)
    params = [a for n_in, n_out in zip(SIZES[:-1], SIZES[1:])
              for a in _init(rng, n_in, n_out)]
    moments = [(np.zeros_like(p), np.zeros_like(p)) for p in params]
    rows = np.arange(len(y))
    t = [0]

    def step():
        w1, c1, w2, c2, w3, c3 = params
        h1 = x @ w1.T + c1
        a1 = np.maximum(h1, 0)
        h2 = a1 @ w2.T + c2
        a2 = np.maximum(h2, 0)
        logits = a2 @ w3.T + c3
        m = logits.max(axis=1, keepdims=True)
        e = np.exp(logits - m)
        s = e.sum(axis=1, keepdims=True)
        loss = np.mean(np.log(s[:, 0]) + m[:, 0] - logits[rows, y])  # noqa: F841
        d3 = e / s
        d3[rows, y] -= 1
        d3 /= len(y)
        da2 = d3 @ w3
        da2 *= h2 > 0
        da1 = da2 @ w2
        da1 *= h1 > 0
        grads = [da1.T @ x, da1.sum(0), da2.T @ a1, da2.sum(0), d3.T @ a2, d3.sum(0)]
        t[0] += 1
        step_size = np.float32(lr / (1 - b1 ** t[0]))
        inv_bc2 = np.float32(1 / np.sqrt(1 - b2 ** t[0]))
        for p, g, (mom, vel) in zip(params, grads, moments):
            mom *= np.float32(b1)
            mom += np.float32(1 - b1) * g
            vel *= np.float32(b2)
            vel += np.float32(1 - b2) * g * g
            p -= step_size * mom / (np.sqrt(vel) * inv_bc2 + np.float32(eps))

    return step


def _median_seconds(fn, repeat, number):
    import timeit

    return float(np.median(timeit.repeat(fn, repeat=repeat, number=number))) / number


def main():
    from nbops.bench.harness import BLAS_PAUSE, warm_up

    ov = ApplyOverhead()
    ov.setup()
    times = {}
    for _ in range(3):    # interleaved, medians of medians
        for name in ("time_direct_kernel", "time_function_apply", "time_operator_call",
                     "time_operator_front"):
            times.setdefault(name, []).append(_median_seconds(getattr(ov, name), 15, 2000))
    base = np.median(times["time_direct_kernel"])
    for name, ts in times.items():
        t = np.median(ts)
        print(f"{name:24s} {t * 1e6:8.2f} us/call   overhead vs direct {1e6 * (t - base):6.2f} us")
    steps = {}
    for impl in ("nbops", "numpy"):
        bench = MLPStep()
        bench.setup(impl)
        steps[impl] = bench
    results = {k: [] for k in steps}
    for _ in range(5):
        for impl, bench in steps.items():
            # a pause between blocks: a BLAS pool keeps spinning for a while
            # after its last call and would slow whichever step runs next
            time.sleep(BLAS_PAUSE)
            warm_up(bench.step)
            results[impl].append(_median_seconds(bench.step, 5, 1))
    med = {k: np.median(v) for k, v in results.items()}
    for impl, t in med.items():
        print(f"MLP step {impl:6s} {t * 1e3:8.2f} ms")
    print(f"numpy / nbops = {med['numpy'] / med['nbops']:.2f}")


if __name__ == "__main__":
    main()
