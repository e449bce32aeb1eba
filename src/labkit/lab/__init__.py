"""The notebook API: ``lab = labkit.lab.start(globals())`` opens one provenance session
per notebook run (see ``session``); ``ipython`` holds the kernel hooks and display."""

from labkit.lab.ipython import load_ipython_extension
from labkit.lab.session import Lab, current, start

__all__ = ["Lab", "current", "load_ipython_extension", "start"]
