"""``python -m scripts.campaign.conv_choice <overrides>``: the convolution path ``model.conv_impl=auto``
chooses on this machine for the run those overrides compose (``train.py``'s config), printed as
one JSON line after ``CONV``. The CPU lane (:mod:`scripts.campaign.lane`) runs it in its code
snapshot before a new run starts and passes the choice to ``train.py`` explicitly, so the run
keeps that path to its end, through every resume, on whatever machine resumes it."""
from __future__ import annotations

import json
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    from hydra import compose, initialize_config_dir

    from lpmetrics.data import build_data
    from lpmetrics.run.builders import conv_path, resolve_device
    root = Path(__file__).resolve().parents[2]
    with initialize_config_dir(config_dir=str(root / "configs"), version_base="1.3"):
        cfg = compose("config", overrides=argv)
    bundle = build_data(cfg.dataset, seed=cfg.seed)
    print("CONV " + json.dumps(conv_path(cfg, bundle, resolve_device(cfg.device)), default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
