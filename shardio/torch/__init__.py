"""Stage 8, the torch side: the only modules that import torch — the datasets, the loader,
the worker handover in shared memory, the device prefetcher and decoder, bench and doctor.
"""
