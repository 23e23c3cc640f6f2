"""CSR sparse operators (to come in their own issue): a validated
``CSRMatrix`` (int32/int64 indices, conversion from COO, dense and SciPy) and
load-balanced SpMV, SpMM, SDDMM and row softmax on CPU and CUDA, with
backward passes. Kernels will live in ``sparse/cpu.py`` and
``sparse/cuda.py`` beside this public module."""
