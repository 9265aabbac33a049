"""The host this process runs on, read from /proc: processes, threads, CPU time, memory (`procfs`, the one reader
of /proc).

May import: nothing of autotune (the standard library only).
"""
