"""Stage 5: a dataset's shards to samples and raw batches — the planned order read run by run,
checked ahead on a thread, gathered by field. Torch-free.
"""
