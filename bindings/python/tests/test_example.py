"""examples/python/train_mlp.py runs and FP8 converges to within 10% of FP32."""

import os
import subprocess
import sys

import libte

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


def test_train_mlp_converges():
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(libte.__file__)))
    env = dict(os.environ, PYTHONPATH=pkg + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "python", "train_mlp.py"),
                        "--steps", "250"], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "within 10%: yes" in r.stdout
