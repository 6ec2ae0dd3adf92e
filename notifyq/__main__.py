from notifyq._cli.main import main

raise SystemExit(main())
