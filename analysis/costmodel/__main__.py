"""``python -m analysis.costmodel``: fit the cost model to a profile and traces, compare with measured runs."""

import sys

from analysis.costmodel.cli import main

sys.exit(main())
