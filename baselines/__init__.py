if not __name__.startswith("lpmetrics."):   # one identity per class (lpmetrics/__init__.py)
    raise ImportError(f"import lpmetrics.{__name__}, not the bare folder name {__name__!r}")
