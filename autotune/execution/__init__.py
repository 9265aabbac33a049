"""Running a search: the search itself (`driver.Search`, its phases as methods, heard by `callbacks.SearchCallback`
objects), its workload's source (`source`: a factory or the user's program, chosen once), its trials' typed
settings (`settings.RunSettings`), the two backends behind one protocol (`protocol.Backend`; `backends.choose`:
`local`, one trial at a time on this host without Ray; `ray`, Ray Tune placing trials on this host or a cluster),
trial processes (launcher, warm fork server, the watch over a running program, ranks spread over nodes), the
device lock, and the reaper that cleans up after a killed driver.

May import every part below it: `autotune.spec`, `plan`, `launch_command` (a launcher's flags), `workload`, `config`,
`knobs`, `trial`, `safety`, `decide`, `records`, `export`, `integrations`, `instrument`, `host`.
"""
