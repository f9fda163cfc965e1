"""Test setup: lets tests import their helper modules (corpus.py) by name."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
