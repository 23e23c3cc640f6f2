"""nbops: deep-learning operators on Numba, for NumPy pipelines and CPU/edge
inference without PyTorch.

Every operator is one call that runs a parallel CPU kernel for NumPy arrays
and a CUDA kernel for device arrays (anything with
``__cuda_array_interface__``), with a backward pass and argument checks that
name what went wrong. Importing nbops compiles nothing: kernels compile on
first use and are cached on disk.

>>> import numpy as np, nbops
>>> nbops.gelu(np.linspace(-2, 2, 5, dtype=np.float32))
array([-0.04550026, -0.15865526,  0.        ,  0.8413447 ,  1.9544997 ], dtype=float32)
"""

__version__ = "0.1.0"

from ._dispatch import (  # noqa: F401
    Operator,
    cuda_available,
    get_operator,
    register_op,
    registered_ops,
    to_device,
    to_host,
)
from ._runtime import get_debug, get_num_threads, set_debug, set_num_threads  # noqa: F401
from ._coexist import get_blas_coexistence, set_blas_coexistence  # noqa: F401
from .activations import *  # noqa: F401,F403
from .activations import __all__ as _activations_all
from .linalg import bmm, linear, matmul  # noqa: F401,E402
from . import autotune  # noqa: F401,E402  (callable module: nbops.autotune(...))
from .tensor import *  # noqa: F401,F403
from .tensor import __all__ as _tensor_all
from .fusion import fuse  # noqa: F401
from . import profiler  # noqa: F401
from .warmup import warmup  # noqa: F401
from .arith import (  # noqa: F401
    add, sub, mul, div, pow, neg, exp, log, sum, mean, expand, sum_to,
)
from .normalization import batch_norm, layer_norm, rms_norm  # noqa: F401,E402
from .conv import (  # noqa: F401,E402
    conv1d, conv2d, conv_bn, conv_bn_relu, conv_pack, conv_relu, fold_batch_norm,
    PackedConv,
)
from .pooling import (  # noqa: F401,E402
    adaptive_avg_pool1d, adaptive_avg_pool2d, avg_pool1d, avg_pool2d, global_avg_pool2d,
    max_pool1d, max_pool2d,
)
from .softmax import log_softmax, softmax  # noqa: F401,E402
from .attention import positional_encoding, scaled_dot_product_attention  # noqa: F401,E402
from .autograd import Tensor, enable_grad, is_grad_enabled, no_grad  # noqa: F401
from . import autograd, nn, optim  # noqa: F401,E402

__all__ = [
    "Operator", "cuda_available", "get_operator", "register_op", "registered_ops",
    "to_device", "to_host", "get_debug", "get_num_threads", "set_debug", "set_num_threads",
    "set_blas_coexistence", "get_blas_coexistence",
    *_activations_all,
    "matmul", "bmm", "linear", "autotune",
    *_tensor_all,
    "fuse", "warmup",
    "add", "sub", "mul", "div", "pow", "neg", "exp", "log", "sum", "mean", "expand", "sum_to",
    "Tensor", "no_grad", "enable_grad", "is_grad_enabled", "autograd", "nn", "optim",
]
__all__ += ["batch_norm", "layer_norm", "rms_norm"]
__all__ += ["max_pool1d", "max_pool2d", "avg_pool1d", "avg_pool2d", "adaptive_avg_pool1d",
            "adaptive_avg_pool2d", "global_avg_pool2d", "softmax", "log_softmax"]
__all__ += ["scaled_dot_product_attention", "positional_encoding"]
__all__ += ["conv1d", "conv2d", "fold_batch_norm", "conv_bn_relu", "conv_bn", "conv_relu",
            "conv_pack", "PackedConv"]
from . import quant  # noqa: E402,F401  (nbops.quant: int8 quantization)
__all__ += ["quant"]

from ._coexist import apply_at_import as _calm_blas  # noqa: E402
_calm_blas()  # OpenBLAS's idle threads sleep instead of spinning (nbops/_coexist.py)
