"""`python -m wsmode`: the same command line as the `wsmode` script."""

import sys

from .cli import main

sys.exit(main())
