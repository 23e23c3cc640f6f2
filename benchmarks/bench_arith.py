"""asv suite of nbops.arith: the bench entries of the arithmetic specs
(broadcast add, a row-broadcast multiply, exp, a row sum) beside NumPy."""

from . import common


class Arith(common.CaseSuite):
    """The arith family's cases from the specs (nbops/arith.py)."""

    params = common.case_params("arith")
