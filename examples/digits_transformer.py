"""A tiny Transformer classifier over the rows of the 8x8 digits.

The code is :mod:`nbops.demo.transformer` (copy it from there: ``python -c "import
nbops.demo.transformer as m; print(m.__file__)"``): it lives in the package so that
``python -m nbops demo`` runs from an installed wheel, which carries no
examples/. This script runs that task alone, with the demo's options, and
prints its rows of the summary table and writes its plots.

Run: ``python examples/digits_transformer.py [--quick] [--device cpu|cuda] [--seed N] [--out DIR]``
(the same as ``python -m nbops demo --only transformer``; scikit-learn for the data,
matplotlib for the plots: ``pip install "nbops[demo]"``).
"""

import sys

from nbops.demo import transformer

if __name__ == "__main__":
    sys.exit(transformer.main())
