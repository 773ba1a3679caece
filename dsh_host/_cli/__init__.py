"""The ``dsh`` command line. Top layer: may import everything below it."""

from .main import main

__all__ = ["main"]
