"""`python -m planner.cli`: the `planner` command."""

from planner.cli.app import main

main()
