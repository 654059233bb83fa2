"""`python -m tgi_llm.launcher` = `tgi-llm-launcher`."""

from tgi_llm.launcher.main import main

raise SystemExit(main())
