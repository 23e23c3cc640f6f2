"""nbops.onnx: run ONNX models on nbops kernels, and export nbops.nn models.

Needs the ``onnx`` package (``pip install "nbops[onnx]"``); onnxruntime is
never imported here.

* :class:`InferenceSession` loads a model (a path, bytes or a ``ModelProto``),
  plans it once (folding, fusion, weight packing) and runs it with
  onnxruntime's surface: ``run(output_names, {name: array})``.
* :func:`export` writes an ``nbops.nn`` model to an ONNX file.
* :mod:`nbops.onnx.backend` implements ``onnx.backend.base.Backend``.

Operator handlers are declared once each in an op table (see
:mod:`nbops.onnx._registry`): the op type, the opset range its semantics
cover, and the function that runs it.
"""

__all__ = ["InferenceSession", "export", "UnsupportedModelError"]


def __getattr__(name):
    # Lazy: `import nbops.onnx` imports neither onnx nor any kernel module.
    if name == "InferenceSession":
        from ._session import InferenceSession

        return InferenceSession
    if name == "export":
        from ._export import export

        return export
    if name == "UnsupportedModelError":
        from ._registry import UnsupportedModelError

        return UnsupportedModelError
    raise AttributeError(f"module 'nbops.onnx' has no attribute {name!r}")
