"""``python -m shardio``: the ``shardio`` command line."""

from shardio.cli import main

if __name__ == "__main__":
    main(prog_name="shardio")
