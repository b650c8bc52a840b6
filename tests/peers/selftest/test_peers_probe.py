"""A test module for run_peers.py's own test (tests/peers/test_run_peers.py), run by regrtest
with --testdir: it behaves differently under the drop-in only when the self-test asks, so
that the runner can be shown to catch a difference and a crash.

RUN_PEERS_PROBE=fail   test_differs fails when libsdalloc_preload.so is preloaded
RUN_PEERS_PROBE=crash  test_differs aborts the process when it is preloaded
otherwise                  both tests pass, with or without the drop-in
"""
import os
import unittest


def _under_the_drop_in():
    return "libsdalloc_preload.so" in os.environ.get("LD_PRELOAD", "")


class PeersProbe(unittest.TestCase):
    def test_same(self):
        self.assertEqual(len(bytes(1 << 16)), 1 << 16)  # served by the pool at 4KiB

    def test_differs(self):
        probe = os.environ.get("RUN_PEERS_PROBE", "")
        if probe == "fail" and _under_the_drop_in():
            self.fail("the self-test's planted difference")
        if probe == "crash" and _under_the_drop_in():
            os.abort()


if __name__ == "__main__":
    unittest.main()
