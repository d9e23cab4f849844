"""`python -m pcd_tools` runs the `pcd` command."""

import sys

from .cli import main

sys.exit(main())
