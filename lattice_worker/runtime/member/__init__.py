"""The member side of a distributed run: the ``deliver`` step, the claim's
lease, a template member's journaled attempt, and nested teams' child runs
(docs/architecture.md, steps 3, 5 and 6)."""
