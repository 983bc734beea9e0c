"""``python -m dasknn.cli`` runs the command line, as ``python -m dasknn`` does."""

import sys

from .main import main

sys.exit(main())
