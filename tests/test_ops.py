"""The op table: every built-in operator whose spec (nbops/_spec.py) declares
samples, run through the checks of nbops.testing on both devices.

* forward vs its NumPy reference (``reference.py``, or the family's test
  file, by the spec's reference name): values, NaN pattern, shape and
  dtype, every sample;
* ``out=``: a fresh output, and each input the spec allows in place;
* the ``out=`` errors every op shares (shape, dtype, device, overlap,
  layout, read-only);
* strided inputs (F order, negative and sliced views) give the contiguous
  result, and are not modified;
* every bad input of the spec raises its error, naming the op;
* the gradient through autograd against central differences (float64).

Hand-written tests remain in each family's file only for what a table row
cannot say: accuracy sweeps, kernel routes, streaming paths, special-value
contracts that differ from the reference's formula.
"""

import numpy as np
import pytest

from nbops import _dispatch
from nbops import testing as checks
import reference as ref

ALL = list(_dispatch.specs().values())
SPECS = [s for s in ALL if s.samples is not None]
IDS = [s.name for s in SPECS]
WITH_OUT = [s for s in SPECS if s.out]
# bad calls run for every spec that declares them, with samples or not
WITH_BAD = [s for s in ALL if s.bad is not None]
WITH_GRAD = [s for s in SPECS if s.grad is not None and s.backward is not None]


def _reference(spec):
    """``reference.py``'s function of the spec's reference name, or, for a
    ``"test_module:attr"`` name, that test module's (a family's own file)."""
    name = spec.reference_name
    return _dispatch.resolve(name) if ":" in name else getattr(ref, name)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_forward_matches_reference(spec, dtype, device):
    if np.dtype(dtype) not in spec.dtypes:
        pytest.skip(f"{spec.name} takes {[str(d) for d in spec.dtypes]}")
    checks.check_forward(spec.name, _reference(spec), dtype, device)


@pytest.mark.parametrize("spec", WITH_OUT, ids=[s.name for s in WITH_OUT])
def test_out_and_inplace(spec, device):
    checks.check_out(spec.name, _reference(spec), device)


@pytest.mark.parametrize("spec", WITH_OUT, ids=[s.name for s in WITH_OUT])
def test_out_errors(spec, device):
    checks.check_out_errors(spec.name, _reference(spec), device)


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_strided_inputs(spec, device):
    checks.check_strided(spec.name, device)


@pytest.mark.parametrize("spec", WITH_BAD, ids=[s.name for s in WITH_BAD])
def test_bad_inputs(spec, device):
    checks.check_bad_inputs(spec.name, device)


@pytest.mark.parametrize("spec", WITH_GRAD, ids=[s.name for s in WITH_GRAD])
def test_gradient(spec):
    checks.check_gradient(spec.name)


def test_every_operator_is_declared():
    """Every built-in operator has a spec with a kernel family and bad inputs,
    and samples (kernels too, unless it composes other operators) or the
    reason why the table cannot run it (``exempt``)."""
    specs = _dispatch.specs()
    assert len(specs) > 90
    for name, spec in specs.items():
        assert spec.family is not None, name
        assert spec.bad is not None, name
        assert spec.samples is not None or spec.exempt, name


def test_checks_fail_for_a_wrong_kernel():
    """The checks can fail: a user op whose kernel is off, whose error does
    not name it, whose out= is ignored, or whose gradient is wrong."""
    from nbops import _spec

    def bad_kernel(x, out=None):
        y = x * 2.0001
        if out is not None:
            out[...] = y
            return out
        return y

    op = _dispatch.register_op("test_ops_wrong", cpu=bad_kernel,
                               backward=lambda ctx, g: (g * 3,),
                               samples=_spec.Elementwise(edge=False), grad=_spec.Grad(),
                               out=True)
    with pytest.raises(AssertionError, match="test_ops_wrong"):
        checks.check_forward(op, lambda x: 2 * x, np.float64, "cpu")
    with pytest.raises(Exception, match="gradcheck|mismatch|differ"):
        checks.check_gradient(op)
    with pytest.raises(AssertionError, match="does not match|was raised"):
        checks.check_out_errors(op, lambda x: 2.0001 * x, "cpu")
