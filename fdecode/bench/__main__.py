"""`python -m fdecode.bench`: the same as `fdecode bench`."""

from fdecode.bench.cli import main

raise SystemExit(main())
