"""Where models run: the allocator setting a pipeline and every command turn on (common/device.py)."""
import json
import os
import subprocess
import sys

import pytest

# A child process, so that its malloc starts as glibc's default: 64 MB touched, freed, touched again.
CHILD = """
import json, os, sys
import numpy as np
from odqa.common.device import keep_freed_memory

def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

kept = keep_freed_memory() if sys.argv[1] == "keep" else False
np.ones(1)   # numpy's own allocations out of the way
before = rss_mb()
block = np.ones(64 * 2**20, dtype=np.uint8)
peak = rss_mb()
del block
print(json.dumps({"kept": kept, "again": keep_freed_memory() if kept else None,
                  "grew": peak - before, "after_free": rss_mb() - before}))
"""


def child(how: str, **env) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, how], capture_output=True, text=True, check=True,
                         env={**os.environ, **env})
    return json.loads(out.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux") or os.confstr("CS_GNU_LIBC_VERSION") is None,
                    reason="glibc's malloc only")
def test_freed_memory_is_kept_for_reuse_rather_than_unmapped():
    plain, kept = child("plain"), child("keep")
    assert plain["grew"] > 60 and kept["grew"] > 60
    assert plain["after_free"] < 8             # glibc's default: a 64 MB block is mmap-ed and unmapped at its free
    assert kept["kept"] and kept["again"]      # set once; asking again says so
    assert kept["after_free"] > 56             # kept: the next batch's activations reuse it, no page faults


def test_the_environment_can_leave_malloc_as_it_is():
    off = child("keep", ODQA_KEEP_FREED_MEMORY="0")
    assert off["kept"] is False and off["again"] is None
    assert off["after_free"] < 8
