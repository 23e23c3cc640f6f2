"""A user-defined operator with a CPU kernel, a CUDA kernel and a backward.

``softsign(x) = x / (1 + |x|)``, with derivative ``1 / (1 + |x|)^2``. Each
direction is a registered operator: a parallel ``@njit`` kernel for NumPy
arrays and a ``@cuda.jit`` kernel for device arrays. The forward's backward
rule calls the gradient operator, so the op joins the autograd tape on both
devices; ``nbops.testing.check_op`` runs its declared samples against a NumPy
reference on each device and ``gradcheck`` verifies the gradient.

Run: ``python examples/custom_op.py`` (the CUDA part runs where a GPU, or
Numba's simulator via ``NUMBA_ENABLE_CUDASIM=1``, is available).
"""

import numpy as np
from numba import cuda, njit, prange

import nbops
import nbops.testing
from nbops.autograd import Tensor, gradcheck


# --- CPU kernels: flat loops over C-contiguous arrays, typed constant "one"
@njit(parallel=True, cache=True)
def _softsign_cpu(x, out, one):
    for i in prange(x.size):
        out[i] = x[i] / (one + abs(x[i]))


@njit(parallel=True, cache=True)
def _softsign_grad_cpu(g, x, out, one):
    for i in prange(x.size):
        d = one + abs(x[i])
        out[i] = g[i] / (d * d)


# --- CUDA kernels: grid-stride loops
@cuda.jit
def _softsign_cuda(x, out, one):
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        out[i] = x[i] / (one + abs(x[i]))


@cuda.jit
def _softsign_grad_cuda(g, x, out, one):
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        d = one + abs(x[i])
        out[i] = g[i] / (d * d)


def _flat(a):
    return a.reshape(a.size)


def softsign_cpu(x):
    x = np.ascontiguousarray(x)
    out = np.empty_like(x)
    _softsign_cpu(_flat(x), _flat(out), x.dtype.type(1))
    return out


def softsign_grad_cpu(g, x):
    g, x = np.ascontiguousarray(g), np.ascontiguousarray(x)
    out = np.empty_like(x)
    _softsign_grad_cpu(_flat(g), _flat(x), _flat(out), x.dtype.type(1))
    return out


def softsign_cuda(x):
    out = cuda.device_array(x.shape, x.dtype)
    _softsign_cuda[4, 32](_flat(x), _flat(out), x.dtype.type(1))
    return out


def softsign_grad_cuda(g, x):
    out = cuda.device_array(x.shape, x.dtype)
    _softsign_grad_cuda[4, 32](_flat(g), _flat(x), _flat(out), x.dtype.type(1))
    return out


softsign_grad = nbops.register_op("softsign_grad", cpu=softsign_grad_cpu,
                                  cuda=softsign_grad_cuda)
softsign = nbops.register_op(
    "softsign", cpu=softsign_cpu, cuda=softsign_cuda,
    # one gradient per forward input; ctx.inputs holds the forward's arrays
    backward=lambda ctx, grad: (softsign_grad(grad, ctx.inputs[0]),),
    # the declaration nbops.testing checks: sample calls (shapes 0, 1, odd,
    # 4-D, then NaN/inf/-0.0/huge values) and the gradient
    samples=nbops.testing.Elementwise(), grad=nbops.testing.Grad())


def softsign_reference(x):
    """The math in float64, what the kernels are checked against."""
    return x / (1 + np.abs(x))


def main():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 5))
    print("softsign:", np.allclose(softsign(x), softsign_reference(x)))
    checked = ["cpu"] + (["cuda"] if nbops.cuda_available() else [])
    # every sample against the reference on each device, strided inputs,
    # and the gradient against finite differences
    nbops.testing.check_op(softsign, softsign_reference, devices=checked)
    assert gradcheck(lambda t: softsign(t) * 3.0, [Tensor(x, requires_grad=True)])
    if "cuda" in checked:
        xd = nbops.to_device(x)
        assert gradcheck(lambda t: softsign(t).sum(axis=0), [Tensor(xd, requires_grad=True)])
    print("custom_op: checks and gradcheck passed on", ", ".join(checked))
    return checked


if __name__ == "__main__":
    main()
