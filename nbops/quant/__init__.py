"""Int8 quantization: ``QTensor`` (int8/uint8 values with per-tensor or
per-channel scale and zero point), quantize / dequantize with ONNX
QuantizeLinear semantics, calibration observers, and int8 kernels with int32
accumulation. Kernels live in ``quant/cpu.py`` and ``quant/cuda.py`` beside
this public module."""

from .qtensor import QTensor, qrange

__all__ = ["QTensor", "qrange"]
