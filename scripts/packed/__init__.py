"""Packed-launcher benchmarks and device checks (packed vs separate steps; a pack's LPs batched).
Imports only the installed core and its siblings."""
