"""asv suites of nbops.tensor: transpose/permute, cat, contiguous, split and
reshape beside NumPy doing the same data movement, and a parallel copy of
the same bytes (``time_copy``: the memory-speed bound) so that each figure
can be read as a ratio to both. Outputs are allocated in ``setup`` unless a
benchmark says ``fresh`` (then the allocation and its page faults count, as
in ``np.ascontiguousarray(a.T)``)."""

import numpy as np

from . import common


def _nbops():
    try:
        import nbops
        from nbops.cpu import tensor as kernels
    except ImportError as exc:
        raise NotImplementedError(f"nbops.tensor is not there: {exc}") from None
    for name in ("transpose", "permute", "cat", "contiguous", "split", "reshape"):
        if not hasattr(nbops, name):
            raise NotImplementedError(f"nbops.{name} does not exist")
    return nbops, kernels


class Tensor(common.CaseSuite):
    """The tensor cases of ``python -m nbops bench`` (1M and 16M elements)."""

    params = common.case_params("tensor")


class Transpose:
    """2-D transpose into a new C-contiguous array; 8192^2 float32 is the
    issue's target (>= 2.5x ``np.ascontiguousarray(a.T)`` on 2 threads)."""

    params = [[1024, 4096, 8192], ["float32", "float64", "uint8"]]
    param_names = ["n", "dtype"]
    timeout = 300

    def setup(self, n, dtype):
        self.nbops, kernels = _nbops()
        self.a = np.random.default_rng(0).integers(0, 100, (n, n)).astype(dtype)
        self.out = np.empty_like(self.a)
        self.flat_in, self.flat_out = self.a.reshape(-1), self.out.reshape(-1)
        self.copy = kernels._flat
        self.nbops.transpose(self.a, out=self.out)  # compile or load from the cache
        self.copy(self.flat_out, self.flat_in)

    def time_nbops_out(self, n, dtype):
        self.nbops.transpose(self.a, out=self.out)

    def time_nbops_fresh(self, n, dtype):
        self.nbops.transpose(self.a)

    def time_numpy_fresh(self, n, dtype):
        np.ascontiguousarray(self.a.T)

    def time_numpy_out(self, n, dtype):
        np.copyto(self.out, self.a.T)

    def time_copy(self, n, dtype):
        self.copy(self.flat_out, self.flat_in)


class Permute:
    """Layout changes of an activation tensor [N, C, H, W] (float32)."""

    params = [[(8, 64, 56, 56), (32, 3, 224, 224)],
              ["NCHW->NHWC", "NHWC->NCHW", "swap HW"]]
    param_names = ["shape", "perm"]
    PERMS = {"NCHW->NHWC": (0, 2, 3, 1), "NHWC->NCHW": (0, 3, 1, 2), "swap HW": (0, 1, 3, 2)}

    def setup(self, shape, perm):
        self.nbops, _ = _nbops()
        self.dims = self.PERMS[perm]
        self.x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
        self.out = np.empty([shape[d] for d in self.dims], np.float32)
        self.nbops.permute(self.x, self.dims, out=self.out)

    def time_nbops_out(self, shape, perm):
        self.nbops.permute(self.x, self.dims, out=self.out)

    def time_numpy_out(self, shape, perm):
        np.copyto(self.out, self.x.transpose(self.dims))


class Cat:
    """Joining k equal pieces of a [4096, 4096] float32 result along an axis."""

    params = [[0, 1], [2, 8]]
    param_names = ["axis", "pieces"]

    def setup(self, axis, pieces):
        self.nbops, _ = _nbops()
        shape = [4096, 4096]
        shape[axis] //= pieces
        rng = np.random.default_rng(0)
        self.arrays = [rng.standard_normal(shape).astype(np.float32) for _ in range(pieces)]
        self.axis = axis
        self.out = np.empty((4096, 4096), np.float32)
        self.nbops.cat(self.arrays, axis, out=self.out)

    def time_nbops_out(self, axis, pieces):
        self.nbops.cat(self.arrays, self.axis, out=self.out)

    def time_numpy_out(self, axis, pieces):
        np.concatenate(self.arrays, self.axis, out=self.out)


class Contiguous:
    """Packing a strided view of a [4096, 8192] float32 matrix."""

    params = [["every other column", "reversed rows", "column block"]]
    param_names = ["view"]
    VIEWS = {"every other column": lambda a: a[:, ::2],
             "reversed rows": lambda a: a[::-1, :4096],
             "column block": lambda a: a[:, 1000:5096]}

    def setup(self, view):
        self.nbops, _ = _nbops()
        base = np.random.default_rng(0).standard_normal((4096, 8192)).astype(np.float32)
        self.x = self.VIEWS[view](base)
        self.nbops.contiguous(self.x)

    def time_nbops(self, view):
        self.nbops.contiguous(self.x)

    def time_numpy(self, view):
        np.ascontiguousarray(self.x)


class Views:
    """split and reshape return views: the cost is the Python around them."""

    def setup(self):
        self.nbops, _ = _nbops()
        self.x = np.zeros((64, 128, 32), np.float32)

    def time_split_sections(self):
        self.nbops.split(self.x, 8, axis=1)

    def time_numpy_array_split(self):
        np.array_split(self.x, 8, axis=1)

    def time_reshape_view(self):
        self.nbops.reshape(self.x, (64, -1))

    def time_numpy_reshape(self):
        self.x.reshape(64, -1)
