"""``hf-geonorm sweep``: ``grid`` (the grid of runs, each as ``hf-geonorm train`` runs it), ``journal`` (every
finished run, appended at once, so that a stopped sweep resumes) and ``report`` (each arm's best rate, and the arms
compared)."""
