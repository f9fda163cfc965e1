"""`python -m graphopt` runs the command-line interface."""

from graphopt.cli import main

raise SystemExit(main())
