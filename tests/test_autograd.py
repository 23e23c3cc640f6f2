"""Autograd: gradcheck of every differentiable operator of the activations,
arith and loss modules on both devices (one table), the Tensor tape
(accumulation, broadcasting, retain_graph, version counters, deep graphs),
Function and its misuse, gradcheck itself, and the plain-array fast path."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import nbops
from helpers import host, to_dev
from nbops import nn
from nbops.autograd import Function, GradcheckError, Tensor, gradcheck

rng = np.random.default_rng(1234)


@pytest.fixture(autouse=True)
def _default_gemm_config(monkeypatch):
    # tiny GEMMs here: timing the autotuner's candidates would dominate the run
    monkeypatch.setenv("NBOPS_AUTOTUNE", "0")


def away_from_zero(shape, low=0.2, high=2.5, r=rng):
    """Values whose magnitude keeps finite differences off the kinks."""
    mag = r.uniform(low, high, shape)
    return np.where(r.random(shape) < 0.5, -mag, mag)


def leaf(x, device, requires_grad=True):
    return Tensor(to_dev(np.asarray(x, np.float64), device), requires_grad=requires_grad)


# ---------------------------------------------------------------------------
# One row per differentiable operator: (op name, fn, input makers). Each maker
# returns a float64 array (a leaf that requires grad) or another argument.

S = (3, 4)
ACT = lambda f, **kw: (lambda x: f(x, **kw))  # noqa: E731

OPS = [
    ("relu", ACT(nbops.relu), [lambda: away_from_zero(S)]),
    ("leaky_relu", ACT(nbops.leaky_relu, negative_slope=0.1), [lambda: away_from_zero(S)]),
    ("sigmoid", ACT(nbops.sigmoid), [lambda: rng.standard_normal(S)]),
    ("tanh", ACT(nbops.tanh), [lambda: rng.standard_normal(S)]),
    ("gelu", ACT(nbops.gelu), [lambda: rng.standard_normal(S)]),
    ("gelu-tanh", ACT(nbops.gelu, approximate="tanh"), [lambda: rng.standard_normal(S)]),
    ("silu", ACT(nbops.silu), [lambda: rng.standard_normal(S)]),
    ("swish", lambda x, b: nbops.swish(x, b),
     [lambda: rng.standard_normal(S), lambda: np.array([1.3])]),
    ("softplus", ACT(nbops.softplus, beta=2.0), [lambda: rng.standard_normal(S)]),
    ("elu", ACT(nbops.elu, alpha=0.7), [lambda: away_from_zero(S)]),
    ("hardswish", ACT(nbops.hardswish), [lambda: away_from_zero(S, 0.2, 2.8)]),
    # inside (-1, 1) and outside, at least 0.1 from both kinks
    ("hardtanh", ACT(nbops.hardtanh),
     [lambda: away_from_zero(S, 0.1, 0.9) + rng.choice([-2.0, 0.0, 2.0], S)]),
    ("hardtanh-relu6", ACT(nbops.hardtanh, min_val=0.0, max_val=6.0),
     [lambda: rng.choice([-1.0, 3.0, 7.0], S) + rng.uniform(-0.8, 0.8, S)]),
    ("add", lambda a, b: a + b, [lambda: rng.standard_normal((2, 3, 4)),
                                 lambda: rng.standard_normal((3, 1))]),
    ("sub", lambda a, b: a - b, [lambda: rng.standard_normal((4,)),
                                 lambda: rng.standard_normal((2, 4))]),
    ("mul", lambda a, b: a * b, [lambda: rng.standard_normal((2, 1, 4)),
                                 lambda: rng.standard_normal((3, 1))]),
    ("div", lambda a, b: a / b, [lambda: rng.standard_normal(S),
                                 lambda: away_from_zero((4,), 0.5, 2.0)]),
    ("pow", lambda a, b: a ** b, [lambda: rng.uniform(0.5, 2.0, S),
                                  lambda: rng.uniform(0.5, 2.0, (1, 4))]),
    ("neg", lambda a: -a, [lambda: rng.standard_normal(S)]),
    ("exp", lambda a: a.exp(), [lambda: rng.standard_normal(S)]),
    ("log", lambda a: a.log(), [lambda: rng.uniform(0.5, 2.0, S)]),
    ("sum", lambda a: a.sum(axis=(0, 2)), [lambda: rng.standard_normal((2, 2, 2))]),
    ("mean", lambda a: a.mean(axis=-1, keepdims=True), [lambda: rng.standard_normal(S)]),
    ("expand", lambda a: nbops.expand(a, (2, 3, 4)), [lambda: rng.standard_normal((3, 1))]),
    ("sum_to", lambda a: nbops.sum_to(a, (1, 3)), [lambda: rng.standard_normal((2, 2, 3))]),
    ("mse_loss", lambda a, b: nn.mse_loss(a, b), [lambda: rng.standard_normal(S),
                                                  lambda: rng.standard_normal(S)]),
    ("binary_cross_entropy_with_logits",
     lambda a, b: nn.binary_cross_entropy_with_logits(a, b, reduction="sum"),
     [lambda: rng.standard_normal(S), lambda: rng.random(S)]),
    ("cross_entropy", lambda a, t: nn.cross_entropy(a, t, reduction="none"),
     [lambda: rng.standard_normal(S), lambda: np.array([0, 3, 1])]),
    # other modules' operators join the tape the same way
    ("transpose", lambda a: nbops.transpose(a), [lambda: rng.standard_normal((2, 3))]),
    ("permute", lambda a: nbops.permute(a, (2, 0, 1)), [lambda: rng.standard_normal((2, 1, 3))]),
    ("reshape", lambda a: nbops.reshape(a.T, (3, 2)), [lambda: rng.standard_normal((2, 3))]),
    ("contiguous", lambda a: nbops.contiguous(a.T), [lambda: rng.standard_normal((2, 3))]),
    ("cat", lambda a, b: nbops.cat([a, b, a], axis=1),
     [lambda: rng.standard_normal((2, 1)), lambda: rng.standard_normal((2, 2))]),
    ("split", lambda a: nbops.split(a, [1, 2], axis=1)[1] * 2.0,
     [lambda: rng.standard_normal((2, 3))]),
    ("matmul", lambda a, b: nbops.matmul(a, b),
     [lambda: rng.standard_normal((2, 3)), lambda: rng.standard_normal((3, 2))]),
    ("bmm", lambda a, b: nbops.bmm(a, b),
     [lambda: rng.standard_normal((2, 2, 3)), lambda: rng.standard_normal((2, 3, 1))]),
    ("linear", lambda x, w, b: nbops.linear(x, w, b),
     [lambda: rng.standard_normal((2, 3)), lambda: rng.standard_normal((2, 3)),
      lambda: rng.standard_normal(2)]),
]


@pytest.mark.parametrize("name,fn,makers", OPS, ids=[o[0] for o in OPS])
def test_gradcheck_every_operator(name, fn, makers, device):
    args = []
    for make in makers:
        a = make()
        args.append(leaf(a, device) if a.dtype.kind == "f" else to_dev(a, device))
    assert gradcheck(fn, args)


def _ops_of(module):
    return {n for n in nbops.registered_ops()
            if nbops.get_operator(n).backward is not None
            and nbops.get_operator(n).__module__ == module.__name__}


@settings(max_examples=25, deadline=None)
@given(shapes=hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=3,
                                                max_side=3),
       op=st.sampled_from(["add", "sub", "mul", "div"]), seed=st.integers(0, 2 ** 16))
def test_gradcheck_broadcasting_random_shapes(shapes, op, seed):
    r = np.random.default_rng(seed)
    a, b = (Tensor(away_from_zero(s, 0.5, 2.0, r), requires_grad=True)
            for s in shapes.input_shapes)
    assert gradcheck(lambda x, y: getattr(nbops, op)(x, y), [a, b])


def test_table_covers_every_differentiable_operator_of_these_modules():
    from nbops import activations, arith, linalg, tensor
    from nbops.nn import losses

    covered = {o[0].split("-")[0] for o in OPS}
    for module in (activations, arith, losses, tensor, linalg):
        assert _ops_of(module) <= covered, _ops_of(module) - covered


def test_gradcheck_float32_inputs_are_promoted():
    x = Tensor(rng.standard_normal(S).astype(np.float32), requires_grad=True)
    assert gradcheck(lambda t: nbops.gelu(t) * t, [x])


# ---------------------------------------------------------------------------
# The tape


def test_gradient_accumulates_over_uses_and_calls(device):
    x = leaf([1.0, 2.0, 3.0], device)
    y = (x * x + x * 3.0 + x).sum()
    y.backward()
    np.testing.assert_allclose(host(x.grad), 2 * np.array([1.0, 2.0, 3.0]) + 4)
    (x * 2.0).sum().backward()          # .grad accumulates across backward calls
    np.testing.assert_allclose(host(x.grad), 2 * np.array([1.0, 2.0, 3.0]) + 6)
    assert type(x.grad) is type(x.data)


def test_broadcast_gradients_are_reduced(device):
    a = leaf(rng.standard_normal((2, 3, 4)), device)
    b = leaf(rng.standard_normal((3, 1)), device)
    c = leaf(rng.standard_normal(()), device)
    ((a * b + c) * 2.0).sum().backward()
    assert host(b.grad).shape == (3, 1) and host(c.grad).shape == ()
    np.testing.assert_allclose(host(b.grad), 2 * host(a.data).sum(axis=(0, 2))[:, None])
    np.testing.assert_allclose(host(c.grad), 2 * 24)


def test_add_gradient_is_not_aliased_between_leaves():
    a, b = leaf(np.ones(3), "cpu"), leaf(np.ones(3), "cpu")
    (a + b).backward(np.ones(3))
    assert a.grad is not b.grad
    a.grad += 1
    np.testing.assert_array_equal(b.grad, np.ones(3))


def test_root_grad_is_copied_into_a_leaf():
    x = leaf(np.zeros(2), "cpu")
    g = np.ones(2)
    x.backward(g)
    x.grad[0] = 5
    assert g[0] == 1


def test_detach_and_no_grad(device):
    x = leaf(np.arange(3.0), device)
    assert not (x.detach() * 2.0).requires_grad
    with nbops.no_grad():
        y = x * 2.0
    assert not y.requires_grad and y.grad_fn is None
    with nbops.no_grad():
        with nbops.enable_grad():
            assert (x * 2.0).requires_grad

    @nbops.no_grad()
    def f(t):
        return t * 2.0

    assert not f(x).requires_grad and nbops.autograd.is_grad_enabled()


def test_graph_freed_after_backward_unless_retained():
    x = leaf(np.arange(3.0), "cpu")
    y = nbops.sigmoid(x).sum()
    y.backward(retain_graph=True)
    y.backward()
    np.testing.assert_allclose(x.grad, 2 * (lambda s: s * (1 - s))(1 / (1 + np.exp(-np.arange(3.0)))))
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        y.backward()


def test_saved_tensor_changed_in_place_is_detected(device):
    x = leaf(rng.standard_normal(4), device)
    w = Tensor(to_dev(rng.standard_normal(4), device))
    y = (x * w).sum()
    w += 1.0                                      # w was saved by mul
    with pytest.raises(RuntimeError, match=r"mul: input 1 \(shape \(4,\)\), saved for backward, was modified in place"):
        y.backward()


def test_output_saved_and_changed_in_place_is_detected():
    x = leaf(rng.standard_normal(4), "cpu")
    y = nbops.sigmoid(x)                          # sigmoid saves its output
    with nbops.no_grad():
        y *= 2.0
    with pytest.raises(RuntimeError, match=r"sigmoid: its output .*its version is 1, it was saved at version 0"):
        y.sum().backward()


def test_optimizer_step_bumps_the_version_of_a_saved_parameter():
    p = nn.Parameter(np.ones(3))
    loss = (p * p).sum()                          # mul saves p
    loss.backward(retain_graph=True)
    nbops.optim.SGD([p], lr=0.1).step()
    with pytest.raises(RuntimeError, match="modified in place"):
        loss.backward()


def test_in_place_on_tensors_in_a_graph_is_refused():
    x = leaf(np.ones(3), "cpu")
    with pytest.raises(RuntimeError, match="leaf tensor that requires grad"):
        x += 1.0
    y = x * 2.0
    with pytest.raises(RuntimeError, match="part of a graph"):
        y[0:1] = 0.0
    with nbops.no_grad():
        x -= 1.0
        x[1:] = np.array([5.0, 6.0])
    np.testing.assert_array_equal(x.data, [0.0, 5.0, 6.0])
    assert x._version == 2


def test_zero_and_setitem_on_device(device):
    t = Tensor(to_dev(np.arange(6.0).reshape(2, 3), device))
    t[:, 1] = to_dev(np.array([7.0, 8.0]), device)
    np.testing.assert_array_equal(host(t.data), [[0, 7, 2], [3, 8, 5]])
    t.zero_()
    np.testing.assert_array_equal(host(t.data), np.zeros((2, 3)))


def test_deep_graph_backward_without_recursion():
    x = leaf(np.array([0.5]), "cpu")
    y = x
    for _ in range(10_000):
        y = y * 1.0001
    y.backward(np.ones(1))
    np.testing.assert_allclose(x.grad, [1.0001 ** 10_000], rtol=1e-9)


def test_shape_ops_and_indexing(device):
    a = leaf(rng.standard_normal((3, 4)), device)
    assert gradcheck(lambda t: t.T.reshape(2, 6)[1, 1:5:2], [a])
    assert gradcheck(lambda t: t.transpose(1, 0)[..., None][:, 2] * 2.0, [a])
    assert gradcheck(lambda t, u: t @ u, [a, leaf(rng.standard_normal((4, 2)), device)])
    assert (a.T @ a).shape == (4, 4) and len(a) == 3 and a.device == device
    with pytest.raises(TypeError, match="only ints, slices"):
        a[[0, 1]]


def test_tensor_to_moves_differentiably():
    x = leaf(np.arange(3.0), "cpu")
    (x.to("cuda") * 2.0).to("cpu").sum().backward()
    np.testing.assert_array_equal(x.grad, [2.0, 2.0, 2.0])
    with pytest.raises(ValueError, match="device must be"):
        x.to("tpu")


def test_tensor_basics():
    t = Tensor([[1.0, 2.0]])
    assert isinstance(t.data, np.ndarray) and t.shape == (1, 2) and t.is_leaf
    assert t.numpy() is not t.data and Tensor(np.array([3.5])).item() == 3.5
    assert "Tensor(" in repr(t) and "grad_fn=<backward of add>" in repr(leaf([1.0], "cpu") + 1.0)
    r = np.ones(2) + leaf([1.0, 2.0], "cpu")        # ndarray + Tensor defers to the Tensor
    assert isinstance(r, Tensor) and r.requires_grad
    with pytest.raises(TypeError, match="float32/float64"):
        Tensor(np.arange(3), requires_grad=True)
    with pytest.raises(ValueError, match="expected 1"):
        t.item()
    with pytest.raises(TypeError, match="must be an array"):
        t.data = 3
    t.data = np.zeros((1, 2))
    assert t._version == 1


# ---------------------------------------------------------------------------
# Misuse


def test_backward_errors(device):
    x = leaf(np.ones(3), device)
    with pytest.raises(RuntimeError, match="does not require grad"):
        Tensor(to_dev(np.ones(3), device)).sum().backward()
    with pytest.raises(RuntimeError, match="one-element output"):
        (x * 2.0).backward()
    with pytest.raises(ValueError, match="grad must match"):
        (x * 2.0).backward(to_dev(np.ones(2), device))
    with pytest.raises(TypeError, match="expected a Tensor"):
        nbops.autograd.backward([np.ones(2)])


def test_mixing_devices_in_one_graph_is_an_error():
    x = leaf(np.ones(3), "cpu")
    y = leaf(np.ones(3), "cuda")
    with pytest.raises(TypeError, match="different devices"):
        x * y
    with pytest.raises(TypeError, match="Square: inputs are on different devices"):
        Square.apply(x, y.data)


class Square(Function):
    @staticmethod
    def forward(ctx, x, *unused):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 2.0 * x * g


class TooMany(Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2.0

    @staticmethod
    def backward(ctx, g):
        return g, g


class WrongShape(Function):
    @staticmethod
    def forward(ctx, x):
        return x.sum(axis=0)

    @staticmethod
    def backward(ctx, g):
        return g


def test_function_backward_misuse_names_the_function():
    x = leaf(np.ones((2, 3)), "cpu")
    with pytest.raises(RuntimeError, match=r"TooMany.backward returned 2 gradient\(s\), expected 1"):
        TooMany.apply(x).sum().backward()
    with pytest.raises(RuntimeError, match=r"WrongShape.backward returned a gradient of shape "
                                           r"\(3,\) for input 0, which has shape \(2, 3\)"):
        WrongShape.apply(x).sum().backward()


def test_operator_without_backward_raises_when_a_gradient_reaches_it():
    nbops.register_op("no_grad_op_for_test", cpu=lambda x: x + 1.0)
    y = nbops.get_operator("no_grad_op_for_test")(leaf(np.ones(2), "cpu"))
    with pytest.raises(RuntimeError, match="no_grad_op_for_test: this operator has no backward"):
        y.sum().backward()


def test_tensor_requiring_grad_passed_by_keyword_to_apply_is_refused():
    with pytest.raises(TypeError, match="positionally"):
        Square.apply(x=leaf(np.ones(2), "cpu"))


# ---------------------------------------------------------------------------
# Function


class MulAdd(Function):
    """Two inputs, two outputs, a non-tensor argument, needs_input_grad."""

    @staticmethod
    def forward(ctx, a, b, scale=1.0):
        ctx.save_for_backward(a, b)
        ctx.scale = scale
        return a * b * scale, a + b

    @staticmethod
    def backward(ctx, g_prod, g_sum):
        a, b = ctx.saved_tensors
        ga = g_prod * b * ctx.scale + g_sum if ctx.needs_input_grad[0] else None
        gb = g_prod * a * ctx.scale + g_sum if ctx.needs_input_grad[1] else None
        return ga, gb, None


def test_function_several_inputs_and_outputs(device):
    a, b = leaf(rng.standard_normal(S), device), leaf(rng.standard_normal(S), device)
    assert gradcheck(lambda x, y: MulAdd.apply(x, y, 3.0), [a, b])
    c = Tensor(to_dev(rng.standard_normal(S), device))     # needs no grad
    assert gradcheck(lambda x: MulAdd.apply(x, c, 2.0)[0], [a])
    prod, total = MulAdd.apply(a, c)
    assert prod.requires_grad and prod.grad_fn is total.grad_fn
    prod.sum().backward()                                  # the unused output gets zeros
    np.testing.assert_allclose(host(a.grad), host(c.data))


def test_function_on_plain_arrays_runs_forward_only():
    x = np.arange(3.0)
    y = Square.apply(x)
    assert type(y) is np.ndarray
    np.testing.assert_array_equal(y, x * x)
    p, s = MulAdd.apply(x, x)
    assert type(p) is np.ndarray and type(s) is np.ndarray


def test_function_output_without_grad_is_a_plain_tensor():
    y = Square.apply(Tensor(np.ones(2)))
    assert isinstance(y, Tensor) and not y.requires_grad


def test_saved_tensors_are_freed_after_backward():
    ctxs = []

    class Keep(Function):
        @staticmethod
        def forward(ctx, x):
            ctxs.append(ctx)
            ctx.save_for_backward(x)
            return x * 1.0

        @staticmethod
        def backward(ctx, g):
            return g

    Keep.apply(leaf(np.ones(2), "cpu")).sum().backward()
    with pytest.raises(RuntimeError, match="freed"):
        ctxs[0].saved_tensors


# ---------------------------------------------------------------------------
# gradcheck catches the two classic mistakes


class ForgotSave(Function):
    """Keeps its input on the class instead of ctx.save_for_backward: a
    second call before backward overwrites it."""

    @staticmethod
    def forward(ctx, x):
        ForgotSave.last_input = x
        return x * x

    @staticmethod
    def backward(ctx, g):
        return 2.0 * ForgotSave.last_input * g


class WrongInput(Function):
    """d(a*b)/da computed from a instead of b."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return a * b

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        return g * a, g * a


def test_gradcheck_catches_forgotten_save_for_backward():
    a, b = leaf(rng.standard_normal(3), "cpu"), leaf(rng.standard_normal(3), "cpu")
    with pytest.raises(GradcheckError, match=r"input 0 is wrong at element \(\d,\): "
                                             r"numerical .*, analytic"):
        gradcheck(lambda x, y: ForgotSave.apply(x) + ForgotSave.apply(y), [a, b])


def test_gradcheck_catches_gradient_from_the_wrong_input(device):
    a, b = leaf(rng.standard_normal(S), device), leaf(rng.standard_normal(S), device)
    with pytest.raises(GradcheckError, match="gradient of input 0 is wrong"):
        gradcheck(WrongInput.apply, [a, b])


def test_gradcheck_argument_errors():
    with pytest.raises(ValueError, match="no input requires grad"):
        gradcheck(lambda x: x, [Tensor(np.ones(2))])
    with pytest.raises(TypeError, match="must return a Tensor"):
        gradcheck(lambda x: 3.0, [leaf(np.ones(2), "cpu")])


def test_gradcheck_reports_the_worst_element():
    class OffByOne(Function):
        @staticmethod
        def forward(ctx, x):
            return x * 1.0

        @staticmethod
        def backward(ctx, g):
            bad = np.array(g, copy=True)
            bad[2] += 1.0
            return bad

    with pytest.raises(GradcheckError, match=r"element \(2,\): numerical .*, analytic"):
        gradcheck(OffByOne.apply, [leaf(np.ones(4), "cpu")])


# ---------------------------------------------------------------------------
# Operator routing details


def test_operator_context_binds_defaults_and_keywords():
    seen = {}

    def rule(ctx, g):
        seen.update(inputs=ctx.inputs, kwargs=dict(ctx.kwargs), needs=ctx.needs_input_grad)
        return g * ctx.kwargs["scale"], None

    op = nbops.register_op("scaled_for_test", cpu=lambda x, y=None, scale=2.0: x * scale,
                           backward=rule)
    x = leaf(np.ones(2), "cpu")
    op(x, scale=3.0).sum().backward()
    assert seen["kwargs"] == {"x": seen["inputs"][0], "y": None, "scale": 3.0}
    assert seen["needs"] == (True, False, False)
    np.testing.assert_array_equal(x.grad, [3.0, 3.0])


def test_user_op_scalar_gradient_for_one_element_input():
    op = nbops.register_op("times_beta_for_test", cpu=lambda x, b: x * b,
                           backward=lambda ctx, g: (g * ctx.inputs[1],
                                                    float(np.sum(g * ctx.inputs[0]))))
    b = leaf(np.array([2.0]), "cpu")
    x = leaf(np.arange(3.0), "cpu")
    assert gradcheck(op, [x, b])
