"""Test setup: helper modules (corpus.py) importable by name; structural verification after
every pass of every compile."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

os.environ.setdefault("GRAPHOPT_VERIFY_PASSES", "1")
