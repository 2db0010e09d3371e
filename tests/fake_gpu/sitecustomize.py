"""Every Python process started with this folder first on ``PYTHONPATH`` and ``SATURN_FAKE_GPUS`` set believes it
drives CUDA GPUs (see ``fake_cuda.py``): the executor, a fresh pool host, its workers, Ray's workers."""

import os

if os.environ.get("SATURN_FAKE_GPUS"):
    import fake_cuda

    fake_cuda.install()
