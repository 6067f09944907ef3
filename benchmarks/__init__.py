"""shardio's benchmark harness: shardio against its peers on identical data, in one run.

Not part of the installed package. ``datagen`` makes the data, ``adapters`` gives every
system the same small interface, ``probe`` holds the measuring instruments, ``child``
runs one measurement in a fresh process, ``run`` drives a whole comparison and
``report`` turns its JSON into the tables of ``benchmarks/README.md``.
"""
