"""`pip install ./python`: the package builds with scikit-build-core (the
project's own CMake), bundles libflexc.so.0 and the flexc command, and
works from where it was installed without anything from the build tree."""
import os
import subprocess
import sys

from cases import ROOT


def test_pip_install_bundles_the_library_and_the_command(tmp_path):
    site = tmp_path / "site"
    env = {k: v for k, v in os.environ.items() if k not in ("FLEXC_LIBRARY", "PYTHONPATH")}
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps",
                    "--no-index", "--quiet", "--target", str(site), os.path.join(ROOT, "python")],
                   check=True, env=env, cwd=tmp_path)
    (info,) = site.glob("flexc-0.1.0.dist-info")
    assert "Tag: py3-none-linux_" in (info / "WHEEL").read_text()  # one wheel for every Python 3
    lib = site / "flexc" / "lib" / "libflexc.so.0"
    assert lib.is_file() and not lib.is_symlink()

    env["PYTHONPATH"] = str(site)
    script = (
        "import numpy as np, flexc, flexc._capi as c\n"
        f"assert c.lib.path == {str(lib)!r}, c.lib.path\n"
        f"k = flexc.compile({os.path.join(ROOT, 'samples', 'causal.score')!r})\n"
        "v = np.arange(32, dtype=np.float32).reshape(1, 1, 4, 8)\n"
        "out = k(v, v, v)\n"
        "assert (out[0, 0, 0] == v[0, 0, 0]).all()\n"
        "print('ok', flexc.__version__, ','.join(flexc.backends()))\n")
    r = subprocess.run([sys.executable, "-c", script], env=env, cwd=tmp_path,
                       capture_output=True, text=True)
    # The wheel has the backends this build has: the cpu backend too, where
    # CMake found LLVM (python/README.md lists it among the prerequisites;
    # a wheel built without it silently runs host tensors on the reference).
    import flexc
    assert r.returncode == 0 and r.stdout.strip() == "ok 0.1.0 " + ",".join(flexc.backends()), \
        (r.stdout, r.stderr)

    flexc_cmd = site / "bin" / "flexc"  # the console script
    good = subprocess.run([str(flexc_cmd), "check", os.path.join(ROOT, "samples", "gemma2.score")],
                          env=env, capture_output=True, text=True)
    assert good.returncode == 0, good.stderr
    bad = tmp_path / "bad.score"
    bad.write_text("mask m(b, h, q, kv) { return q >= ; }\n")
    r = subprocess.run([str(flexc_cmd), "check", str(bad)], env=env, capture_output=True, text=True)
    assert r.returncode == 1 and "bad.score:1:" in r.stderr
    r = subprocess.run([sys.executable, "-m", "flexc", "ir", os.path.join(ROOT, "samples",
                        "softcap.score")], env=env, capture_output=True, text=True)
    assert r.returncode == 0 and "tanh" in r.stdout, r.stderr
