"""The lead side of a distributed run: ``run_lead`` and ``resume_lead``
segments, their lead lease, the member calls a tool batch dispatches, resume,
recovery after a crash, and the end of a run (docs/architecture.md, steps 2 and 4)."""
