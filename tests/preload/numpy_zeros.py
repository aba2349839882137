"""A short numpy workload of large np.zeros / np.empty loops, run under the preload with
FALLOW_STATS=1 by scripts/test-capi.sh, which checks from the statistics printed at exit that
fallow served the arrays and skipped zeroing for pages it knew to be zero."""
import time

import numpy as np

MiB = 1 << 20
t0 = time.perf_counter()
for i in range(40):
    a = np.zeros(64 * MiB // 8)  # calloc: fallow skips the memset for zeroed/reported pages
    assert a[:: 4096 // 8].sum() == 0.0
    a[:: 4096 // 8] = i
    del a
    b = np.empty(32 * MiB // 8)  # malloc: reuses dirty pages, no zeroing
    b[:: 4096 // 8] = 1.0
    del b
c = np.zeros((2048, 2048))
c += 1
assert c.sum() == 2048 * 2048
print(f"numpy zeros/empty workload: {time.perf_counter() - t0:.2f} s")
