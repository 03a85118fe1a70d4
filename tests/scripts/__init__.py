"""Driver programs the tests run as separate processes (``python -m tests.scripts.NAME ARGS``): a process holds one
SparkContext, so each cluster session gets its own interpreter. Each prints one ``REPORT {json}`` line."""
