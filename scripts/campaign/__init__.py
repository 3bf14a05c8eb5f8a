"""The 40k-step campaign (DESIGN.md, "The campaign"): ``python -m scripts.campaign <subcommand>``.

Its modules import each other, the installed core and the tables engine (:mod:`scripts.tables`),
never the reverse. The device scripts (``gpu_window.sh``, ``gpu_campaign.sh``, ...) sit beside them."""
