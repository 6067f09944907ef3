"""Stage 7: whole-dataset tools — verify, unpack, merge, preview. Torch-free.
"""
