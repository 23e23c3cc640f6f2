"""Int8 quantization (to come in its own issue): ``QTensor`` (int8/uint8
values with per-tensor or per-channel scale and zero point), quantize /
dequantize with ONNX QuantizeLinear semantics, calibration observers, and
int8 kernels with int32 accumulation for add, linear, matmul and conv on CPU
(laid out for VNNI-style dot products) and CUDA. Kernels will live in
``quant/cpu.py`` and ``quant/cuda.py`` beside this public module."""
