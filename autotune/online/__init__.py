"""The production loader tuner: `for batch in OnlineLoader(loader):`, the DataLoader re-tuned while the user's own
training program runs, behind `autotune.config()`'s `online`. It is not a trial: no search, no process of its own.
The iterator the user loops over (`loader`), its options (`options`), which move to try and whether it won
(`moves`), and the measurements behind them: a window of steps, the host's readings, a worker's pace (`window`).

torch (imported on call) and the standard library only.
May import: `autotune.host` (/proc), `autotune.stats` (Student's t). Nothing of the trial (autotune.trial): it
shares no code with a trial's measured loop.
"""
