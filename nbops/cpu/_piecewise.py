"""Table-driven float64 functions for AVX-512: piecewise polynomials whose
coefficients are picked per lane by a permute.

Why: a float64 softplus through :mod:`nbops.cpu._approx` is an exponential
and a degree-19 polynomial, about 42 vector operations per 8 elements, and
runs compute-bound at about half a copy's bandwidth (docs/benchmarks.md).
A polynomial per unit interval of the
argument needs no exponential: ``vpermt2pd`` picks each coefficient for 8
lanes at once from a 16-entry table held in two registers, and a permute
issues beside the FMAs. LLVM never emits it from scalar code (a table
lookup in a loop becomes a gather, which its cost model rejects, and the
loop runs scalar), so the code here is written as LLVM IR for whole
vectors, behind one ``@intrinsic``, :func:`vector_run`, for each kind:

* ``"softplus"``: ``log1p(exp(-a))`` for ``a = |beta x|`` in [0, 16), one
  degree-14 polynomial per interval ``[j, j + 1)``: 15 permutes and 14
  FMAs a vector, against 34 FMAs and 8 other operations; a vector with a
  lane past 16 (or NaN) takes an exponential and three terms of log1p's
  series for those lanes.

Where the target lacks AVX-512 (``avx512f`` and ``avx512dq``: Numba
compiles for the host CPU unless ``NUMBA_CPU_NAME`` says otherwise), or for
float32 (whose ``_approx`` kernels already run at memory speed), the
kernels keep the general formulas (:func:`host_available` tells them).

Not everything gains: gelu's ``Phi(-a) = exp(-a^2/2) M(a)`` with M from a
degree-15 table in place of ``_approx.ndtr``'s rational of degrees 10/11
and its division was slower (the exponential stays, and 16 permutes cost
more than 6 FMAs and a division; docs/benchmarks.md); not kept.

Accuracy: the polynomials' approximation error is at most 1.2e-16
relative (``tools/fit_approx.py softplus64``, which generated the table
below); measured end to end against long double references
(``tests/test_piecewise.py``): 1.47 ulp (the ``_approx`` formula: 2.03).
"""

from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from . import _approx
from ._memory import splat

__all__ = ["vector_run", "available", "host_available", "KINDS", "LANES", "TABLE_END"]

#: float64 lanes of one vector (one zmm register).
LANES = 8

#: The tables cover arguments below this: 16 intervals of width 1.
TABLE_END = 16.0


def available(context):
    """Whether the CPU target compiles AVX-512 (F and DQ) code: the
    features of the target machine Numba built, not those of the host."""
    features = getattr(context.codegen(), "_tm_features", "") or ""
    return all(f"+{f}" in features.split(",") for f in ("avx512f", "avx512dq"))


def host_available():
    """:func:`available` for Numba's CPU target, from Python."""
    from numba.core.registry import cpu_target
    return available(cpu_target.target_context)


@intrinsic(prefer_literal=True)
def vector_run(typingctx, kind, x, out, start, stop, p0, p1, inv_p0):
    """``out[i] = f(x[i])`` for the whole vectors of ``LANES`` elements in
    ``[start, stop)``, f as :mod:`nbops._formulas` defines the activation
    ``kind`` (a string literal, one of :data:`KINDS`) with parameters
    ``(p0, p1)`` and ``inv_p0 = 1 / p0`` (softplus: beta, threshold and
    1/beta). Returns the end of the last whole vector,
    where the caller takes over for the rest (fewer than ``LANES``).

    ``x``, ``out``: 1-D C-contiguous float64 arrays (the same array for in
    place: each vector is loaded before it is stored); ``start``, ``stop``
    within both. Other dtypes, or a target without AVX-512 (see
    :func:`available`): returns ``start`` and writes nothing."""
    scalars = (p0, p1, inv_p0)
    if not (isinstance(kind, types.StringLiteral) and kind.literal_value in KINDS
            and isinstance(x, types.Array) and isinstance(out, types.Array)
            and x.ndim == out.ndim == 1 and x.layout == out.layout == "C"
            and x.dtype == out.dtype and isinstance(x.dtype, types.Float)
            and all(isinstance(s, types.Float) for s in scalars)):
        return None
    sig = types.intp(kind, x, out, types.intp, types.intp, *scalars)
    name = kind.literal_value

    def codegen(context, builder, signature, args):
        if x.dtype != types.float64 or not available(context):
            return args[3]
        xa, oa = (context.make_array(t)(context, builder, v)
                  for t, v in zip(signature.args[1:3], args[1:3]))
        params = [context.cast(builder, v, t, types.float64) for v, t in zip(args[5:], scalars)]
        # the loop is a function of its own, not inlined: in the caller's
        # body, beside the formula's loop, it lost the table's addresses
        # from registers (101 instructions a vector instead of 69, 20% slower)
        fn = _run_function(builder.module, name, KINDS[name])
        return builder.call(fn, [xa.data, oa.data, args[3], args[4], *params])

    return sig, codegen


def _run_function(module, kind, vector):
    """The LLVM function ``i64 (double* x, double* out, i64 start, i64 stop,
    double p0, double p1, double inv_p0)`` of :func:`vector_run`: its loop
    over whole vectors, each computed by ``vector(builder, v, params)``
    (which may add blocks, and leaves the builder in the last)."""
    name = f"nbops_piecewise_{kind}_f64"
    if name in module.globals:
        return module.globals[name]
    i64 = ir.IntType(64)
    fn = ir.Function(module, ir.FunctionType(i64, [_D.as_pointer(), _D.as_pointer(), i64, i64,
                                                   _D, _D, _D]), name)
    fn.linkage = "internal"
    fn.attributes.add("noinline")
    xp, op, start, stop, *params = fn.args
    builder = ir.IRBuilder(fn.append_basic_block("entry"))
    lanes = ir.Constant(i64, LANES)
    params = [splat(builder, _V, v) for v in params]
    entry = builder.block
    head, body, done = (fn.append_basic_block(n) for n in ("head", "body", "done"))
    builder.branch(head)

    builder.position_at_end(head)
    i = builder.phi(i64)
    i.add_incoming(start, entry)
    builder.cbranch(builder.icmp_signed("<=", builder.add(i, lanes), stop), body, done)

    builder.position_at_end(body)
    v = builder.load(_vector_at(builder, xp, i), align=8)
    builder.store(vector(builder, v, params), _vector_at(builder, op, i), align=8)
    i.add_incoming(builder.add(i, lanes), builder.block)
    builder.branch(head)

    builder.position_at_end(done)
    builder.ret(i)
    return fn


def _softplus(builder, v, params):
    beta, threshold, inv_beta = params
    z = builder.fmul(v, beta)
    a = _call(builder, "llvm.fabs.v8f64", z)
    inside, g = _table(builder, _SOFTPLUS_COLUMNS, a)
    g = _unless_all(builder, inside, g, lambda: _log1p_exp_far(builder, a))
    # max(z, 0) + g, times 1/beta; x itself past the threshold
    zpos = builder.fcmp_ordered(">", z, _const(0.0))
    soft = builder.fmul(builder.select(zpos, builder.fadd(z, g), g), inv_beta)
    return builder.select(builder.fcmp_ordered(">", z, threshold), v, soft)


#: kind -> the code of one vector
KINDS = {"softplus": _softplus}


def _table(builder, columns, a):
    """``(a < TABLE_END, p(a))``: the piecewise polynomial at ``a >= 0``,
    interval 0's for lanes past the table (whatever their value)."""
    inside = builder.fcmp_ordered("<", a, _const(TABLE_END))
    j = builder.fptosi(builder.select(inside, a, _const(0.0)), _VI)
    # exact for j >= 1; for j = 0 within half an ulp of 1/2, which moves
    # the result by at most 0.2 ulp
    t = builder.fsub(a, builder.fadd(builder.sitofp(j, _V), _const(0.5)))
    return inside, _piecewise(builder, columns, j, t)


def _unless_all(builder, mask, value, other):
    """``value`` where every lane of ``mask`` is set (no other code runs),
    else ``select(mask, value, other())``: ``other`` only for the vectors
    that need it (rare in activations: a lane past the table, or NaN)."""
    rest = builder.append_basic_block("rest")
    join = builder.append_basic_block("join")
    before = builder.block
    every = builder.icmp_unsigned("==", builder.bitcast(mask, ir.IntType(LANES)),
                                  ir.Constant(ir.IntType(LANES), -1))
    builder.cbranch(every, join, rest)
    builder.position_at_end(rest)
    mixed = builder.select(mask, value, other())
    rest_end = builder.block
    builder.branch(join)
    builder.position_at_end(join)
    result = builder.phi(_V)
    result.add_incoming(value, before)
    result.add_incoming(mixed, rest_end)
    return result


def _log1p_exp_far(builder, a):
    """log1p(exp(-a)) for a >= TABLE_END (NaN -> NaN): with e = exp(-a) <=
    1.2e-7, e - e^2/2 + e^3/3 (the next term is 1e-21 of e)."""
    lo = _const(_APPROX64["EXP_LO"])
    w = builder.select(builder.fcmp_ordered(">", a, builder.fneg(lo)), lo, builder.fneg(a))
    em1, s1, s2 = _exp_parts(builder, w, _const(0.0))
    e = builder.fmul(_fma(builder, em1, s1, s1), s2)
    h = _fma(builder, builder.fneg(e), _const(1.0 / 3.0), _const(0.5))
    return _fma(builder, builder.fneg(builder.fmul(e, e)), h, e)


def _exp_parts(builder, hi, lo):
    """exp(hi + lo) = (1 + em1) s1 s2 as ``(em1, s1, s2)``, the operations
    of :func:`nbops.cpu._approx._exp_sum`: hi - n ln2 = r, expm1(r) by its
    polynomial, 2^n as two normal factors so that a result below the
    normal range rounds once (down to 0 past 745.2)."""
    k = _APPROX64
    shifted = _fma(builder, builder.fadd(hi, lo), _const(k["LOG2E"]), _const(k["SHIFT"]))
    n = builder.fneg(builder.fsub(shifted, _const(k["SHIFT"])))
    r = _fma(builder, n, _const(k["LN2_HI"]), hi)
    r = builder.fadd(r, _fma(builder, n, _const(k["LN2_LO"]), lo))
    em1 = _fma(builder, builder.fmul(r, r), _horner(builder, _approx._EXP64, r), r)
    # n from the low bits of the shifted sum, both halves' exponents biased
    nb = builder.sub(builder.bitcast(shifted, _VI), _ivec(k["SHIFT_BITS"] - 2 * k["BIAS"]))
    n1 = builder.ashr(nb, _ivec(1))
    s1 = builder.bitcast(builder.shl(n1, _ivec(52)), _V)
    s2 = builder.bitcast(builder.shl(builder.sub(nb, n1), _ivec(52)), _V)
    return em1, s1, s2


def _horner(builder, coefs, x):
    """Horner's rule with the constant coefficients ``coefs`` (constant
    term first)."""
    acc = None
    for c in reversed(coefs):
        acc = _const(c) if acc is None else _fma(builder, acc, x, _const(c))
    return acc


def _fma(builder, a, b, c):
    return _call(builder, "llvm.fma.v8f64", a, b, c)


def _piecewise(builder, columns, j, t):
    """Horner's rule in ``t`` whose coefficient k in each lane is column k
    of the table permuted by that lane's interval index ``j``. Each permute
    is emitted beside the FMA that takes it: all 15 emitted first (one
    Horner helper for both) stayed live together and made the run slower
    than the formula's kernel (docs/benchmarks.md)."""
    acc = None
    for lo, hi in reversed(columns):
        c = _call(builder, "llvm.x86.avx512.vpermi2var.pd.512", lo, j, hi,
                  arg_types=(_V, _VI, _V))
        acc = c if acc is None else _fma(builder, acc, t, c)
    return acc


_D = ir.DoubleType()
_V = ir.VectorType(_D, LANES)
_VI = ir.VectorType(ir.IntType(64), LANES)


def _ivec(value):
    return ir.Constant(_VI, [ir.Constant(ir.IntType(64), int(value))] * LANES)


def _const(value):
    return ir.Constant(_V, [ir.Constant(_D, float(value))] * LANES)


def _vector_at(builder, data, i):
    return builder.bitcast(builder.gep(data, [i]), _V.as_pointer())


def _call(builder, name, *args, arg_types=None):
    fnty = ir.FunctionType(_V, list(arg_types or [_V] * len(args)))
    return builder.call(cgutils.get_or_insert_function(builder.module, fnty, name), list(args))


def _columns(table):
    """The table's coefficient k for intervals 0-7 and 8-15 as two constant
    vectors (vpermt2pd's two sources), for each k, constant term first."""
    return [(ir.Constant(_V, [ir.Constant(_D, row[k]) for row in table[:LANES]]),
             ir.Constant(_V, [ir.Constant(_D, row[k]) for row in table[LANES:]]))
            for k in range(len(table[0]))]


# BEGIN generated by tools/fit_approx.py softplus64
# softplus64: log1p(exp(-a)) on [j, j+1), j = 0..15, polynomial in t = a - j - 1/2; relative error
#   degree 14; max relative error of the rounded coefficients 1.19e-16
_SOFTPLUS64 = (
    (0.4740769841801067, -0.37754066879814546, 0.1175018561007965, -0.009592799142041168, -0.00401486484536717, 0.0008729660874827568, 0.00018836135110054892, -7.744362770721171e-05, -7.233857706615965e-06, 6.586091117990007e-06, -1.4129758122291716e-08, -5.303634267035928e-07, 4.9140471851169575e-08, 3.7532252525502995e-08, -7.195301432584785e-09),
    (0.2014132779827524, -0.18242552380635635, 0.07457322603516642, -0.0157883687974571, 0.0006532694616442024, 0.0006234490741124898, -0.00016676103404349353, -1.1144309905390656e-06, 1.0569391776143914e-05, -2.256313337950254e-06, -1.950425288308267e-07, 1.9633437976917803e-07, -3.101095460398976e-08, -6.907214366113299e-09, 3.4971045833432336e-09),
    (0.07888973429254963, -0.07585818002124352, 0.035051858272553034, -0.009911305974242576, 0.0016923554210840541, -7.867366783244275e-05, -4.9984707678770064e-05, 1.6955314433947754e-05, -2.282999320960855e-06, -1.8966625208104773e-07, 1.6626731623381288e-07, -3.7325604430260026e-08, 2.2687398501959385e-09, 1.4737393575425814e-09, -8.044397000116406e-10),
    (0.029750418272620566, -0.02931223075135633, 0.014226511939867651, -0.004464163446109146, 0.0009831490196867227, -0.00014699680286495815, 9.624955692694117e-06, 2.2094138491375862e-06, -9.463804733028018e-07, 1.8853382723615791e-07, -1.941265756275523e-08, -1.381841144601084e-09, 1.147149537782189e-09, -2.942762276277987e-10, 2.6774290662671123e-11),
    (0.011047744848593817, -0.010986942630593178, 0.005433114861112487, -0.0017712427395147608, 0.0004232408346731499, -7.701409866962918e-05, 1.038603428303158e-05, -8.234870708470005e-07, -4.77656537810445e-08, 3.4237800457966066e-08, -7.939988151336503e-09, 1.2204115500463736e-09, -8.375652199090777e-11, -2.812640249817445e-12, -3.0309450313897066e-11),
    (0.0040784432705707205, -0.004070137715896135, 0.0020267858474350042, -0.0006700957507976883, 0.0001647909597408685, -3.187501886515704e-05, 4.956418386460953e-06, -6.084314360827368e-07, 5.1926318656774193e-08, -6.669101857942473e-10, -8.684018722762054e-10, 2.4007257943402337e-10, -7.226284101784525e-11, -4.628563428311348e-12, 3.610516897512932e-11),
    (0.0015023101597542838, -0.001501182256736992, 0.0007494643542845375, -0.0002490713963676637, 6.189366603791431e-05, -1.2229565659668443e-05, 1.9887906063535667e-06, -2.700862226749797e-07, 3.0294085077040635e-08, -2.6091141518929825e-09, 1.1466909363191441e-10, 1.5733462259123906e-11, -8.802857735153328e-12, 6.104216613298772e-13, 3.814408825221361e-12),
    (0.0005529314753607964, -0.0005527786369235993, 0.0002762365363510725, -9.197704701302316e-05, 2.2943404739041067e-05, -4.568363445046789e-06, 7.546340355060347e-07, -1.0587889138240566e-07, 1.2755511193404548e-08, -1.3113488028709583e-09, 1.0947663061768761e-10, -6.378707971638875e-12, 1.86750327498284e-12, 2.3746564364318173e-13, -2.2104618821293806e-12),
    (0.0002034476721294431, -0.00020342697805520642, 0.00010169279775989894, -3.388380788095233e-05, 8.464058388451955e-06, -1.6900555066762498e-06, 2.807578194604828e-07, -3.9846222668876735e-08, 4.915431375307713e-09, -5.316259347288518e-10, 4.9911064794655476e-11, -4.121008365874324e-12, 1.2897054540716988e-12, 7.85088563639069e-14, -1.1679272181124758e-12),
    (7.484902862926716e-05, -7.484622751061127e-05, 3.7420312776421534e-05, -1.2471570412640424e-05, 3.1169591180947878e-06, -6.23018492650705e-07, 1.0371200618110452e-07, -1.4780466459479877e-08, 1.8386471901747408e-09, -2.023325024838777e-10, 2.0025837762358463e-11, -1.7172899402840783e-12, -3.9231856515733005e-13, -2.1731898793348424e-14, 5.799331092852807e-13),
    (2.7536070228685513e-05, -2.753569111458346e-05, 1.3767466450148755e-05, -4.588902752248533e-06, 1.1470993277380225e-06, -2.293693244973196e-07, 3.8211374737461305e-08, -5.4539560885571e-09, 6.80548177533792e-10, -7.534530871035426e-11, 7.443388885086042e-12, -6.804322346471903e-13, 1.6391467428456902e-13, 8.056014692460871e-15, -1.2402076686034875e-13),
    (1.0130042289579063e-05, -1.0129990980873915e-05, 5.064944182078061e-06, -1.6882805221341879e-06, 4.220530281963354e-07, -8.44037648308335e-08, 1.406501358454022e-08, -2.0086365157612647e-09, 2.50920850740309e-10, -2.7841856524173022e-11, 2.7531628065838782e-12, -2.559029451427731e-13, 8.903933644816506e-14, 3.894236800912325e-15, -7.655302301106578e-14),
    (3.7266462281239904e-06, -3.726639284186561e-06, 1.8633126981730782e-06, -6.21099603461546e-07, 1.552725862484073e-07, -3.1053591408496184e-08, 5.175289923848655e-09, -7.392389792330603e-10, 9.238321491794492e-11, -1.0259778016627012e-11, 1.0228127745312315e-12, -9.322189975130769e-14, 1.3898943486469341e-14, -3.7686202137657786e-16, -6.8009966954814044e-15),
    (1.370958146620535e-06, -1.3709572068578452e-06, 6.85477663667113e-07, -2.2849192804860498e-07, 5.7122668757933004e-08, -1.142440845301893e-08, 1.9040263404194826e-09, -2.719917998997549e-10, 3.399563582257392e-11, -3.776830707929299e-12, 3.796103766910302e-13, -3.380320630278682e-14, -3.1065654426336637e-15, -8.028713314755094e-16, 6.744139571726634e-15),
    (5.043475353846485e-07, -5.043474082014513e-07, 2.5217357691755984e-07, -8.405777418382727e-08, 2.101440115234262e-08, -4.2028632717188734e-09, 7.00471542675943e-10, -1.0006576203697684e-10, 1.2508003239869147e-11, -1.3895965875108179e-12, 1.378679607957886e-13, -1.2839962236848538e-14, 4.134986213807328e-15, 1.612059646142155e-16, -3.452114897530895e-15),
    (1.855391190492144e-07, -1.8553910183683322e-07, 9.276953370604088e-08, -3.0923166427085975e-08, 7.730785869105073e-09, -1.546154879157523e-09, 2.576917197593855e-10, -3.681287997604195e-11, 4.601500544807114e-12, -5.112943383373284e-13, 5.144302030648646e-14, -4.579189104004843e-15, -5.231497982871388e-16, -1.0897889393248357e-16, 1.0259198596992901e-15),
)
# END generated

_SOFTPLUS_COLUMNS = _columns(_SOFTPLUS64)
#: the float64 constants of _approx's exponential
_APPROX64 = {k: _approx._F64[k] for k in ("EXP_LO", "LOG2E", "SHIFT", "LN2_HI", "LN2_LO",
                                          "SHIFT_BITS", "BIAS")}
