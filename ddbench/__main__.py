from ddbench.cli import main

raise SystemExit(main())
