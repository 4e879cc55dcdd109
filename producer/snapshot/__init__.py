"""Snapshots: the rows a table already holds, read in key-ordered chunks while streaming.

``watermarks`` holds the method (pure): why each chunk is exact; ``copy_text`` and
``chunk_sql`` the SQL side (pure); ``catalog`` and ``reader`` the I/O; ``schemas.snapshot_state``
the resume point kept in Kafka; ``coordinator`` ties them to the pipeline's stream: which tables
are read (start-up, signals, new tables), on ``windows``, which drives one window at a time
through its watermarks, with ``publish`` turning a window's rows into events for the pipeline's
``sink``.
"""
