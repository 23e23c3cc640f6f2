"""CPU kernels: one module per public module (the mirror rule), parallel
``@njit`` kernels and their launchers; no argument checks, no dispatch."""
