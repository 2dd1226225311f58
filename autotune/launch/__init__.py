"""The parent side of a trial: launching the probe child and classifying how it ended."""
