"""CPU kernels of the optimizers (:mod:`nbops.optim`): one fused pass over
each parameter that reads its gradient and state and writes the parameter
and state back, instead of NumPy's chain of temporaries (an Adam step is a
dozen array expressions in NumPy, one memory pass here).

The per-element updates are the plain functions of :mod:`nbops._scalars`,
which :mod:`nbops.cuda.optim` compiles again as device functions. ``s`` holds the
step's scalars already in the parameter's dtype (float32 math for float32
parameters).
"""

from numba import prange
from numba.extending import register_jitable

from .._jit import serial_and_parallel
from .._scalars import adam_update, sgd_update
from .._tunables import SERIAL_BELOW as PARALLEL_MIN

__all__ = ["sgd_step", "adam_step"]


register_jitable(sgd_update)
register_jitable(adam_update)


def _kernels(update, name, n_state):
    def one_state(p, g, a, s):
        for i in prange(p.size):
            update(i, p, g, a, s)

    def two_states(p, g, a, b, s):
        for i in prange(p.size):
            update(i, p, g, a, b, s)

    serial, parallel = serial_and_parallel(one_state if n_state == 1 else two_states, name)

    def launch(p, *rest):
        (parallel if p.size >= PARALLEL_MIN else serial)(p, *rest)

    launch.__name__ = launch.__qualname__ = name
    return launch


sgd_step = _kernels(sgd_update, "sgd_step", 1)
sgd_step.__doc__ = "Update the flat parameter ``p`` and its momentum buffer in place."
adam_step = _kernels(adam_update, "adam_step", 2)
adam_step.__doc__ = "Update the flat parameter ``p`` and its moments ``m``, ``v`` in place."
