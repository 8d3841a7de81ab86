"""Layer L2: queue semantics over the log (classic queue cursors; streams later)."""
