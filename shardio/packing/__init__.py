"""Stage 6: files and other containers to shards and a manifest — walk, plan, build in
parallel (locally or on Dask), resume, append. Reads an existing dataset through reading/.
"""
