"""The shardio release number, written into every manifest."""

__version__ = "0.1.0"
