"""An engine core that takes a minute to load (to test cancelling a load)."""

import time


class SlowLoadingCore:
    def __init__(self, config):
        time.sleep(60)
        raise RuntimeError("should have been cancelled")
