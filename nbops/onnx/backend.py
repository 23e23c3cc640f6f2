"""``onnx.backend.base.Backend`` on nbops: the onnx package's backend test
suite runs through it (tests/test_onnx_backend.py).

>>> import nbops.onnx.backend as backend               # doctest: +SKIP
>>> rep = backend.prepare(model, "CPU")               # doctest: +SKIP
>>> outputs = rep.run([x])                            # doctest: +SKIP
"""

from onnx.backend.base import Backend, BackendRep, Device, DeviceType

from ._session import InferenceSession

__all__ = ["NbopsBackend", "NbopsRep", "prepare", "run_model", "supports_device"]


class NbopsRep(BackendRep):
    """A prepared model: ``run(inputs)`` with the inputs in the graph's order
    (a list, a tuple, one array or a dict by name) returns the outputs in
    the graph's order."""

    def __init__(self, session):
        self.session = session

    def run(self, inputs, **kwargs):
        names = [i.name for i in self.session.get_inputs()]
        if isinstance(inputs, dict):
            feeds = dict(inputs)
        else:
            if not isinstance(inputs, (list, tuple)):
                inputs = [inputs]
            if len(inputs) != len(names):
                raise ValueError(f"nbops.onnx.backend: the model takes {len(names)} inputs "
                                 f"{names}, got {len(inputs)}")
            feeds = dict(zip(names, inputs))
        return tuple(self.session.run(None, feeds))


class NbopsBackend(Backend):
    """prepare / run_model / supports_device on :class:`InferenceSession`."""

    @classmethod
    def prepare(cls, model, device="CPU", **kwargs):
        super().prepare(model, device, **kwargs)
        dev = "cuda" if Device(device).type == DeviceType.CUDA else "cpu"
        return NbopsRep(InferenceSession(model, device=dev))

    @classmethod
    def run_model(cls, model, inputs, device="CPU", **kwargs):
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def supports_device(cls, device):
        d = Device(device)
        if d.type == DeviceType.CPU:
            return True
        if d.type == DeviceType.CUDA:
            import nbops

            return nbops.cuda_available()
        return False


prepare = NbopsBackend.prepare
run_model = NbopsBackend.run_model
supports_device = NbopsBackend.supports_device
