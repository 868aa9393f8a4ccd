"""`python -m presto_ray.cli`: the `presto-ray` command."""

import sys

from presto_ray.cli import main

sys.exit(main())
