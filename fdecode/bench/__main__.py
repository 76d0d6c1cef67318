"""`python -m fdecode.bench`: the same as `fdecode bench`.
(docs/design.md, "Benchmarks, assets and tools").
"""

from fdecode.bench.cli import main

raise SystemExit(main())
