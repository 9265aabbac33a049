"""Convergence safety: the safety levels (which knob classes a search may change), loss parity against the
baseline (one rank and many), and the hand-stepped training runs parity compares.

Runs with torch alone. May import: `autotune.knobs`, `autotune.workload`.
"""
