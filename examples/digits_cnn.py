"""A small CNN on the 8x8 digits: train, fuse, quantize to int8, export to ONNX.

The code is :mod:`nbops.demo.cnn` (copy it from there: ``python -c "import
nbops.demo.cnn as m; print(m.__file__)"``): it lives in the package so that
``python -m nbops demo`` runs from an installed wheel, which carries no
examples/. This script runs that task alone, with the demo's options, and
prints its rows of the summary table and writes its plots.

Run: ``python examples/digits_cnn.py [--quick] [--device cpu|cuda] [--seed N] [--out DIR]``
(the same as ``python -m nbops demo --only cnn``; scikit-learn for the data,
matplotlib for the plots: ``pip install "nbops[demo]"``).
"""

import sys

from nbops.demo import cnn

if __name__ == "__main__":
    sys.exit(cnn.main())
