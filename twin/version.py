"""The product version (written into every trace as ``twin_version``)."""

__version__ = "0.1.0"
