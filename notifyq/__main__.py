from notifyq.cli import main

raise SystemExit(main())
