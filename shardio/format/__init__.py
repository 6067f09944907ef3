"""Stage 1, the bytes on disk: record and block layouts, codecs, checksums, the manifest.

Imports nothing of shardio but its errors; every stage above reads and writes through it.
"""
