"""Stage 2 (pure): which sample is read when — blocks, the rank and worker split, shuffle
windows, mixtures and the resumable state. numpy only; no I/O.
"""
