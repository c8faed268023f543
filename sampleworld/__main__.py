"""``python -m edje.sampleworld``."""

import sys

from .cli import main

sys.argv[0] = "python -m edje.sampleworld"  # argparse names the program after it in usage lines
sys.exit(main())
