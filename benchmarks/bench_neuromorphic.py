"""asv suites of nbops.neuromorphic: the spiking neurons over T=100 steps of
[batch 64, 4096 neurons] beside the NumPy loop over time (the seed
article's loop) and a parallel copy of the same bytes (the memory-bound
ceiling), the backward through time beside a NumPy BPTT loop, one streaming
step, and the rate encoder beside NumPy's generator. Read ratios off
benchmarks of one run; ``tools/bench_neuromorphic.py`` prints them."""

import numpy as np

SHAPE = (100, 64, 4096)


def _nm():
    try:
        import nbops.neuromorphic as nm
    except ImportError as exc:  # a commit before the neuromorphic package
        raise NotImplementedError(str(exc)) from None
    return nm


def _tool():
    import importlib.util
    import os

    path = os.path.join(os.path.dirname(__file__), os.pardir, "tools", "bench_neuromorphic.py")
    spec = importlib.util.spec_from_file_location("_bench_neuromorphic_tool", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class Neurons:
    """Forward of each model, float32 inputs, float32 or uint8 spikes."""

    params = [["lif", "if_neuron", "synaptic", "alif"], ["float32", "uint8"]]
    param_names = ["model", "spikes"]

    def setup(self, model, spikes):
        nm = _nm()
        self.x = (np.random.default_rng(0).random(SHAPE) * 0.6).astype(np.float32)
        self.out = np.empty(SHAPE, spikes)
        args = {"lif": (0.9,), "if_neuron": (), "synaptic": (0.8, 0.9), "alif": (0.9,)}[model]
        fn = getattr(nm, model)
        self.call = lambda: fn(self.x, *args, spike_dtype=self.out.dtype, out=self.out)
        self.call()

    def time_nbops(self, model, spikes):
        self.call()


class Baselines:
    """The NumPy loop over time (LIF, reset by subtraction) and a parallel
    copy of as many bytes as LIF moves with float32 spikes."""

    def setup(self):
        tool = _tool()
        self.tool = tool
        self.x = (np.random.default_rng(0).random(SHAPE) * 0.6).astype(np.float32)
        self.out = np.empty_like(self.x)
        self.copy = tool._copy_kernel()
        self.copy(self.x.reshape(-1), self.out.reshape(-1))

    def time_numpy_loop(self):
        self.tool.numpy_lif(self.x, np.float32(0.9), np.float32(1.0), self.out)

    def time_copy(self):
        self.copy(self.x.reshape(-1), self.out.reshape(-1))


class Backward:
    """LIF backward through time (fast-sigmoid surrogate) beside NumPy BPTT."""

    timeout = 120

    def setup(self):
        self.nm = _nm()
        self.tool = _tool()
        rng = np.random.default_rng(0)
        self.x = (rng.random(SHAPE) * 0.6).astype(np.float32)
        self.g = rng.standard_normal(SHAPE).astype(np.float32)
        self.gx = np.empty_like(self.x)
        self.nm.lif_backward(self.g[:2], self.x[:2], 0.9)

    def time_nbops(self):
        self.nm.lif_backward(self.g, self.x, 0.9, out=self.gx)

    def time_numpy_bptt(self):
        self.tool.numpy_lif_bptt(self.g, self.x, np.float32(0.9), np.float32(1.0),
                                 np.float32(25.0))


class Step:
    """One streaming step of [64, 4096] (``lif_step``)."""

    def setup(self):
        nm = _nm()
        self.nm = nm
        self.x = (np.random.default_rng(0).random(SHAPE[1:]) * 0.6).astype(np.float32)
        self.state = nm.LIFState(np.zeros_like(self.x))
        self.p = nm.LIFParameters(0.9, 1.0, "subtract")
        self.spikes = np.empty_like(self.x)
        nm.lif_step(self.x, self.state, self.p)

    def time_lif_step(self):
        self.nm.lif_step(self.x, self.state, self.p)

    def time_lif_step_in_place(self):
        # the edge loop: spikes and membrane into the same two buffers every step
        self.nm.lif_step(self.x, self.state, self.p, out=self.spikes, inplace=True)


class Rate:
    """Bernoulli rate coding of [64, 4096] intensities over 100 steps, uint8."""

    def setup(self):
        self.nm = _nm()
        self.x = np.random.default_rng(0).random(SHAPE[1:]).astype(np.float32)
        self.nm.rate(self.x, 2)
        self.rng = np.random.default_rng(1)

    def time_nbops(self):
        self.nm.rate(self.x, SHAPE[0], seed=3)

    def time_numpy(self):
        (self.rng.random(SHAPE, np.float32) < self.x).astype(np.uint8)

    def peakmem_nbops(self):
        self.nm.rate(self.x, SHAPE[0], seed=3)
