"""The notebook API: ``lab = labkit.lab.start(globals())`` opens one provenance session
per notebook run (see ``session``); ``ipython`` holds the kernel hooks and display."""

from labkit.lab.session import Lab, current, start

__all__ = ["Lab", "current", "load_ipython_extension", "start"]


def load_ipython_extension(ip) -> None:  # `%load_ext labkit.lab`
    start(ip.user_ns)
