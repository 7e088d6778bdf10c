from inference.simulator.cli import main

raise SystemExit(main())
