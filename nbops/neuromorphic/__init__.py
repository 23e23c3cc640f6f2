"""Spiking neurons (to come in their own issue): LIF, IF, synaptic and
adaptive-threshold neurons over time-major spike trains ``[T, ...]`` with the
time loop inside one kernel, a streaming one-step form, surrogate-gradient
backward through time, and rate/latency/delta encoders. Kernels will live in
``neuromorphic/cpu.py`` and ``neuromorphic/cuda.py``."""
