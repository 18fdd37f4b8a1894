"""`python -m longswift ...` (what `torchrun -m longswift` runs): the command line."""

import sys

from .console import main

sys.exit(main())
