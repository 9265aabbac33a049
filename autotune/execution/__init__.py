"""Running a search: the driver's loop, Ray Tune as its backend (trials placed on this host or a cluster), trial
processes (launcher, warm fork server, ranks spread over nodes), the device lock, and the reaper that cleans up
after a killed driver.

May import every part below it: `autotune.spec`, `workload`, `knobs`, `trial`, `safety`, `decide`, `records`,
`export`, `integrations`.
"""
