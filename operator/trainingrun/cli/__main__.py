"""``python -m trainingrun.cli``: the ``trainingrun`` command, where its script is not on PATH."""

import sys

from trainingrun.cli import main

sys.exit(main())
