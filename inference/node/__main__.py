from inference.node.cli import main

raise SystemExit(main())
