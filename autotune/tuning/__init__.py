"""The search's own logic: the study loop, skips, selection, the estimate, workers."""
