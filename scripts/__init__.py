"""The scripts that regenerate the paper's tables and run its studies, grouped by subject (README.md).

Run a tool as a module from the repository root: ``python -m scripts.<folder>.<tool>``."""
