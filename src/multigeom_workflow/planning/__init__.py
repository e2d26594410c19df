"""
What a run has left and what it will take: progress and the estimate of every dry run
(`plan`), the per-image shards of remote executors (`shards`), time and USD (`cost`),
and the live view drawn by the workflow's logger plugin (`live_view`).
"""
