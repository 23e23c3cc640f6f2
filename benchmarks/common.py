"""Helpers shared by the asv suites.

The suites time the cases of :mod:`nbops.bench` (the table behind
``python -m nbops bench``): one definition of each op's inputs and NumPy
baseline serves the command line, the demo and asv. A suite for a family is

    class Tensor(common.CaseSuite):
        params = common.case_params("tensor")

which gives ``time_nbops_out`` beside ``time_numpy_out`` (both writing into
an output allocated in ``setup``) for every case, size and dtype. Anything
missing at a benchmarked commit (the op, the case, nbops.bench itself)
makes ``setup`` raise ``NotImplementedError``, which asv shows as skipped.
"""

import abc

#: Elements per input: 1M (fits the last-level cache in pieces) and 16M
#: (memory-bound).
SIZES = [1 << 20, 1 << 24]
DTYPES = ["float32", "float64"]


def case_names(family):
    """Names of the cases of ``family`` in nbops.bench (empty if unavailable)."""
    try:
        from nbops.bench import harness
    except ImportError:
        return []
    return [c.name for c in harness.cases().values() if c.family == family]


def case_params(family, sizes=SIZES, dtypes=DTYPES):
    return [case_names(family), list(sizes), list(dtypes)]


def get_case(name, dtype):
    """The case called ``name``, or NotImplementedError when it cannot run."""
    try:
        from nbops.bench import harness
    except ImportError as exc:
        raise NotImplementedError(f"nbops.bench is not there: {exc}") from None
    case = harness.cases().get(name)
    if case is None:
        raise NotImplementedError(f"no bench case {name!r}")
    missing = case.missing()
    if missing:
        raise NotImplementedError(f"nbops.{missing[0]} does not exist")
    if dtype not in {d.name for d in case.dtypes}:
        raise NotImplementedError(f"{name} has no {dtype} version")
    return case


def prepare(name, n, dtype):
    """``(call_nbops, call_baseline)`` on fresh inputs, both warmed up (the
    first call compiles or loads the kernel from the cache)."""
    import numpy as np

    case = get_case(name, dtype)
    inputs = tuple(case.setup(n, np.dtype(dtype), np.random.default_rng(0)))
    shape, out_dtype = (case.out_like(inputs) if case.out_like is not None
                        else (inputs[0].shape, inputs[0].dtype))
    out_n, out_b = np.empty(shape, out_dtype), np.empty(shape, out_dtype)

    def call_nbops():
        case.run(*inputs, out=out_n)

    def call_baseline():
        with np.errstate(all="ignore"):
            case.baseline(*inputs, out=out_b)

    call_nbops()
    call_baseline()
    return call_nbops, call_baseline


class CaseSuite(abc.ABC):
    """Times one family's cases: ``params`` = (case, size, dtype).

    Abstract until a subclass sets ``params``, so that asv does not collect
    this base class itself.
    """

    param_names = ["op", "size", "dtype"]
    timeout = 300

    @property
    @abc.abstractmethod
    def params(self):
        """``case_params(family)``, set by each subclass."""

    def setup(self, name, n, dtype):
        self.nbops_call, self.baseline_call = prepare(name, n, dtype)

    def time_nbops_out(self, name, n, dtype):
        self.nbops_call()

    def time_numpy_out(self, name, n, dtype):
        self.baseline_call()
