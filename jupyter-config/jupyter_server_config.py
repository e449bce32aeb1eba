# JupyterLab for this project (`make lab` passes this file with --config).
#
# - Saving strips outputs (labkit.lab.save_hook): autosave must not change the tracked
#   notebooks that `labkit reproduce` runs; the outputs are logged in MLflow.
# - New notebooks and consoles get the project's `labkit` kernel (installed into .venv by
#   scripts/setup.sh), so a user-level `python3` kernelspec cannot pick another interpreter.
# jupytext's server extension (enabled in .venv/etc/jupyter) keeps each .ipynb paired with
# its .py; this file does not replace that configuration, it adds to it.
from labkit.lab.save_hook import strip_outputs

c = get_config()  # noqa: F821 (defined by Jupyter when it loads this file)
c.ContentsManager.pre_save_hook = strip_outputs
c.MappingKernelManager.default_kernel_name = "labkit"
