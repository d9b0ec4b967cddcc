"""Multi-turn episodes (docs/multi-turn.md): tool calls parsed from the policy's replies (`calls`), environments, and
the whole trajectory as one sequence with the observations masked (`episodes`)."""
