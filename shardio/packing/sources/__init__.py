"""What pack reads samples from: a folder tree, WebDataset tars, Parquet and Arrow tables,
MosaicML MDS folders, and Python objects.
"""
