"""``python -m scripts.campaign <subcommand>``: the campaign's command line (:mod:`scripts.campaign.cli`)."""
import sys

from scripts.campaign.cli import main

sys.exit(main())
