"""Plumbing: atomic file writes (`files`), the run-folder lock (`lock`), model and path names (`paths`), quieting
third-party logs (`quiet`), SIGTERM as Ctrl-C (`signals`), torch's CPU threads (`threads`)."""
