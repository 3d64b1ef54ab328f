"""``hf-geonorm sweep``: ``grid`` (the grid of runs, each as ``hf-geonorm train`` runs it), ``journal`` (every
finished run, appended at once, so that a stopped sweep resumes) and ``report`` (each arm's best rate, and the arms
compared); ``engine`` trains the runs on worker processes (``workers``) or on many machines sharing a database
(``storage``), the protocol walked over the finished runs (``protocol``)."""
