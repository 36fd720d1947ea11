from pykbroker.cli import main

raise SystemExit(main())
