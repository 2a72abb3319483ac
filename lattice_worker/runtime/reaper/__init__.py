"""The reaper: crash recovery for claimed messages, lead segments and lost
doorbells, under one deployment-wide lock (docs/architecture.md, "Crash")."""
