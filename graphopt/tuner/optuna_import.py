"""optuna, imported on a thread of its own, so that the first import keeps no caller alive.

optuna keeps the ImportError of an optional backend it lacks (redis), and that error's
traceback holds every frame above the import: imported first inside optimize() or save(), it
would keep that call's model and weights alive for the life of the process. A thread's stack
has no such frames.
"""

from __future__ import annotations

import importlib
import sys
import threading

if "optuna" not in sys.modules:
    _importer = threading.Thread(target=importlib.import_module, args=("optuna",),
                                 name="graphopt-import-optuna")
    _importer.start()
    _importer.join()

import optuna  # noqa: E402 - imported above (or failing here with its own ImportError)

__all__ = ["optuna"]
