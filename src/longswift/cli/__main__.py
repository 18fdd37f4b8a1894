"""`python -m longswift.cli` (same as `python -m longswift`)."""

import sys

from . import main

sys.exit(main())
