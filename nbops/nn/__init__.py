"""Neural-network building blocks on nbops operators: modules with
PyTorch's parameter names, and losses.

>>> import numpy as np, nbops
>>> from nbops import nn
>>> model = nn.Sequential(nn.Linear(4, 16, rng=0), nn.Swish(), nn.Linear(16, 3, rng=1))
>>> loss = nn.cross_entropy(model(np.ones((8, 4), np.float32)), np.zeros(8, np.int64))
>>> loss.backward()                     # gradients in model's parameters' .grad
"""

from .layers import GELU, Dropout, Hardtanh, Linear, ReLU, ReLU6, Sigmoid, SiLU, Swish, Tanh
from .losses import binary_cross_entropy_with_logits, cross_entropy, mse_loss
from .module import Module, Parameter, Sequential

__all__ = ["Module", "Parameter", "Sequential", "Linear", "ReLU", "GELU", "SiLU", "Sigmoid",
           "Tanh", "Hardtanh", "ReLU6", "Swish", "Dropout", "mse_loss", "cross_entropy",
           "binary_cross_entropy_with_logits"]
from .spiking import ALIF, LIF, Synaptic, TimeDistributed  # noqa: E402,F401
__all__ += ["LIF", "Synaptic", "ALIF", "TimeDistributed"]
from .graph import GraphConv  # noqa: E402,F401
__all__ += ["GraphConv"]
from .normalization import BatchNorm1d, BatchNorm2d, LayerNorm, RMSNorm  # noqa: E402,F401
__all__ += ["BatchNorm1d", "BatchNorm2d", "LayerNorm", "RMSNorm"]
from .pooling import (  # noqa: E402,F401
    AdaptiveAvgPool1d, AdaptiveAvgPool2d, AvgPool1d, AvgPool2d, Flatten, LogSoftmax, MaxPool1d,
    MaxPool2d, Softmax,
)
__all__ += ["MaxPool1d", "MaxPool2d", "AvgPool1d", "AvgPool2d", "AdaptiveAvgPool1d",
            "AdaptiveAvgPool2d", "Flatten", "Softmax", "LogSoftmax"]
from .conv import Conv1d, Conv2d, FusedConv, fuse_modules  # noqa: E402,F401
__all__ += ["Conv1d", "Conv2d", "FusedConv", "fuse_modules"]
from .transformer import MultiheadAttention, TransformerEncoderLayer  # noqa: E402,F401
__all__ += ["MultiheadAttention", "TransformerEncoderLayer"]
