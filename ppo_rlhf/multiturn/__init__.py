"""Multi-turn episodes (docs/multi-turn.md): tool calls parsed from the policy's replies (`calls`), environments, the
whole trajectory as one sequence with the observations masked (`episodes`), and episodes as a rollout generator
(`generator`)."""
