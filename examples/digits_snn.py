"""A spiking network (rate-coded pixels, Linear -> LIF -> Linear -> LIF) on the 8x8 digits.

The code is :mod:`nbops.demo.snn` (copy it from there: ``python -c "import
nbops.demo.snn as m; print(m.__file__)"``): it lives in the package so that
``python -m nbops demo`` runs from an installed wheel, which carries no
examples/. This script runs that task alone, with the demo's options, and
prints its rows of the summary table and writes its plots.

Run: ``python examples/digits_snn.py [--quick] [--device cpu|cuda] [--seed N] [--out DIR]``
(the same as ``python -m nbops demo --only snn``; scikit-learn for the data,
matplotlib for the plots: ``pip install "nbops[demo]"``).
"""

import sys

from nbops.demo import snn

if __name__ == "__main__":
    sys.exit(snn.main())
