"""Coverage-guided fuzzing of the scenario loader and the trace readers with atheris (libFuzzer).

Not part of the test suite (atheris is optional: pip install atheris).  Any exception other than a
pdsim error is a crash that atheris reports with the input that caused it.
Run: .venv/bin/python benchmarks/fuzz_atheris.py -max_total_time=60 [-runs=N]
"""
from __future__ import annotations

import sys
import tempfile
import warnings
from pathlib import Path

import atheris

with atheris.instrument_imports():
    from pdsim import config
    from pdsim.errors import PdsimError
    from pdsim.traces import load_trace

warnings.simplefilter("ignore")
TMP = Path(tempfile.mkdtemp(prefix="pdsim-fuzz-"))
FORMATS = ["auto", "azure", "vidur", "lengths", "mooncake"]


def one(data: bytes) -> None:
    if not data:
        return
    kind, body = data[0] % 6, data[1:]
    path = TMP / ("s.yaml" if kind == 5 else f"t.{'jsonl' if kind == 4 else 'csv'}")
    path.write_bytes(body)
    try:
        if kind == 5:
            config.load(path)
        else:
            load_trace(path, FORMATS[kind])
    except PdsimError as exc:
        msg = str(exc)
        if not msg.startswith(str(path)) or "\n" in msg:
            raise AssertionError(f"unclear error: {msg!r}")


if __name__ == "__main__":
    atheris.Setup(sys.argv, one)
    atheris.Fuzz()
