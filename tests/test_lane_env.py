"""The CPU lane's training environment: one thread, and glibc's malloc kept from mapping fresh
pages for a training step's large temporaries (``lane.MALLOC_ENV``): a 32 px GEMM step faults on
thousands of new pages with the defaults and on almost none with the lane's settings."""
import os
import subprocess
import sys

import pytest

from scripts.campaign import lane
from scripts.cpu.bench_levers import MALLOC_STEPS


def faults_per_step(env: dict) -> float:
    out = subprocess.run([sys.executable, "-c", MALLOC_STEPS, "3"], env=env, check=True, capture_output=True,
                         text=True).stdout.split()
    return float(out[-1])


def test_train_env_sets_threads_and_malloc():
    env = lane.train_env()
    assert env["OMP_NUM_THREADS"] == "1"
    for key, value in lane.MALLOC_ENV.items():
        assert env[key] == value


@pytest.mark.slow   # two processes each build and step a ResNet-18 (~10-25 s)
def test_malloc_env_stops_the_page_faults_of_a_step():
    base = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")} | {"OMP_NUM_THREADS": "1"}
    default, kept = faults_per_step(base), faults_per_step(base | lane.MALLOC_ENV)
    assert default > 1000
    assert kept < default / 10
