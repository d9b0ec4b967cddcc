from ppo_rlhf.cli import main

raise SystemExit(main())
