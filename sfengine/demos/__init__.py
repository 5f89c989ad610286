"""Demonstrations for behaviour cloning: HDF5 files in robomimic's / LIBERO's dataset layout (``dataset``)."""

from sfengine.demos.dataset import Demo, DemoFileError, DemoSet, DemoWriter, read_demos, write_demos

__all__ = ["Demo", "DemoFileError", "DemoSet", "DemoWriter", "read_demos", "write_demos"]
