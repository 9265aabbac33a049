"""Running a search: the driver's one loop and its two backends (`backends.choose`: `local`, one trial at a time
on this host without Ray; `ray`, Ray Tune placing trials on this host or a cluster), trial processes (launcher,
warm fork server, ranks spread over nodes), the device lock, and the reaper that cleans up after a killed driver.

May import every part below it: `autotune.spec`, `launch_command` (a launcher's flags), `workload`, `config`,
`knobs`, `trial`, `safety`, `decide`, `records`, `export`, `integrations`, `instrument`, `host`.
"""
