# JupyterLab for this project (`make lab` passes this file with --config).
#
# - Notebooks keep their outputs on disk: a saved notebook still shows its figures when
#   reopened. The tracked files stay clean through git, not through the save: the
#   `nbstripout` filter that scripts/setup.sh configures (.gitattributes names the notebooks)
#   strips outputs, execution counts and front-end metadata whenever git reads a notebook,
#   so `git status` and `labkit reproduce` see only what a reproduction runs (sources, tags,
#   kernelspec, jupytext pairing). Editing a parameter is a change to a tracked source:
#   git shows it, and `labkit reproduce` refuses until it is committed or undone.
# - New notebooks and consoles get the project's `labkit` kernel (installed into .venv by
#   scripts/setup.sh), so a user-level `python3` kernelspec cannot pick another interpreter.
# - Kernels talk to the server over local IPC sockets, not TCP: nothing listens on a port,
#   and ipykernel has no "running over TCP without encryption" warning to print.
# - No news feed and no update check: no "get notified about official Jupyter news?" popup
#   over the notebook, no calls home from a closed network.
# - LABKIT_JUPYTER_SESSION names this server for its kernels: a downstream notebook (03, 05,
#   06) reads the newest upstream run of the same JupyterLab session (labkit/lab/upstream.py).
# jupytext's server extension (enabled in .venv/etc/jupyter) keeps each .ipynb paired with
# its .py; this file does not replace that configuration, it adds to it.
import os
import socket
import time
import uuid
import warnings

from labkit.lab.gitfilter import refresh_after_save

c = get_config()  # noqa: F821 (defined by Jupyter when it loads this file)
# git reports a notebook whose size changed as modified without reading it through the
# filter: after a save that changed only outputs, refresh its index entry (nothing is staged)
c.ContentsManager.post_save_hook = refresh_after_save
# jupytext derives its contents manager from the configured one and the config is applied to
# it again: the same hook set twice is not worth a warning on the terminal
warnings.filterwarnings("ignore", message=r"Overriding existing post_save_hook \(refresh_after_save\)")
c.MappingKernelManager.default_kernel_name = "labkit"
c.KernelManager.transport = "ipc"
c.LabApp.news_url = None
c.LabApp.check_for_updates_class = "jupyterlab.NeverCheckForUpdate"
# the news question itself is asked while the setting `fetchNews` is "none": answered "false"
# in lab-settings/overrides.json (JupyterLab's app-level settings defaults)
c.LabApp.app_settings_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lab-settings")
os.environ.setdefault(
    "LABKIT_JUPYTER_SESSION",
    f"{socket.gethostname()}:{os.getpid()}:{time.strftime('%Y%m%dT%H%M%S')}:{uuid.uuid4().hex[:6]}",
)
