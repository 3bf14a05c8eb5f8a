"""The tables engine: paper tables from run folders, the paper's printed numbers, per-run summaries,
learning curves, and the campaign queue files it reads (plain JSON). Imports only the installed core."""
