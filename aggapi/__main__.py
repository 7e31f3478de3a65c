from aggapi.cli import main

raise SystemExit(main())
