"""`python -m clef_cli` runs the CLI."""

from clef_cli.cli import main

main()
