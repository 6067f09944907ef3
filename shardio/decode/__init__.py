"""Stage 2 (pure): a sample's bytes to pixels and values — images, crops, named fields.
Torch-free; the torch side turns what it returns into tensors.
"""
