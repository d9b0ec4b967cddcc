"""Plumbing: atomic file writes (`files`), the run-folder lock (`lock`), model and path names (`paths`), device and
dtype names (`device`), quieting third-party logs (`quiet`), SIGTERM as Ctrl-C (`signals`), torch's CPU threads
(`threads`)."""
