"""The login side (hpc/node/ is the node side). ``python -m hpc...`` run from a user's directory must not import the
user's own ``train.py`` or ``train/`` in place of the project's: the working directory leaves ``sys.path`` first
(`hpc.node.clean_path`)."""

import sys

from hpc.node.clean_path import drop_working_dir, module_run

drop_working_dir(module_run(sys.orig_argv))
