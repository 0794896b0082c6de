"""`python -m hermes_batch.tools.browser prepare`: the browser driver, fetched once (a package's
__main__, so the toolset's module is not run a second time as a script)."""

import sys

from . import _main

_main(sys.argv[1:])
