"""CUDA kernels: one module per public module, mirroring ``nbops/cpu/``.
Imported only when a device array first reaches an operator."""
