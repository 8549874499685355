"""The worked recovery scenarios (README.md here): ``load(name, objects_dir)`` and ``NAMES``."""
from .loader import NAMES, load, object_bytes, path_of, read

__all__ = ["NAMES", "load", "object_bytes", "path_of", "read"]
