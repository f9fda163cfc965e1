"""`python -m graphopt` runs the command-line interface."""

from graphopt.cli import entry

entry()
