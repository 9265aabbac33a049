"""autotune.execution.proposer: SIGTERM stops a search as Ctrl-C does, whatever the search inherited."""

import os
import signal
import time

import pytest

from autotune.execution.proposer import stop_on_sigterm


@pytest.mark.parametrize("ctrl_c", [signal.default_int_handler, signal.SIG_IGN])
def test_sigterm_is_ctrl_c_even_where_ctrl_c_is_ignored(ctrl_c):
    """With Ctrl-C's handler in place, SIGTERM goes through it (Ray Tune's, during its run, ends the run cleanly);
    where Ctrl-C is ignored, as a script's background job inherits it, SIGTERM raises it all the same (a README walk:
    the SIGINT it was passed on as was lost, and the re-measurement's pairs ran on)."""
    kept = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        signal.signal(signal.SIGINT, ctrl_c)
        stop_on_sigterm()
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler runs at the next bytecode: a sleep it cuts short
    finally:
        for s, handler in kept.items():
            signal.signal(s, handler)
