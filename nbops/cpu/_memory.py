"""Memory hints for Numba CPU kernels.

:func:`prefetch` asks for a cache line that the hardware prefetchers cannot
guess (the random rows of a sparse product), or for the next row of a
row-by-row kernel before the current row's arithmetic, so that its memory
traffic overlaps that arithmetic instead of following it. An ``@intrinsic``
emitting ``llvm.prefetch``: generic LLVM IR, so it builds for any target
(``prefetcht0`` on x86-64).
"""

from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

__all__ = ["prefetch"]


@intrinsic
def prefetch(typingctx, arr, i, j):
    """Hint the cache to fetch ``arr[i, j]`` (``arr[i]`` for 1-D arrays, ``j``
    ignored): read, keep in all cache levels. Never faults, whatever the
    index."""
    if not isinstance(arr, types.Array):
        return None

    def codegen(context, builder, sig, args):
        aryty = sig.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        idx = [context.cast(builder, v, t, types.intp)
               for v, t in zip(args[1:], sig.args[1:])][:aryty.ndim]
        ptr = cgutils.get_item_pointer(context, builder, aryty, ary, idx, wraparound=False)
        i8p = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]),
            "llvm.prefetch.p0")
        # read, high locality, data cache
        builder.call(fn, [builder.bitcast(ptr, i8p), ir.Constant(i32, 0), ir.Constant(i32, 3),
                          ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return types.void(arr, i, j), codegen
