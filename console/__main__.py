"""``python -m console``: the ``hotspare`` command (how a view starts a detached controller)."""

from console.cli import main

raise SystemExit(main())
