"""Several host stand-in devices (KMM_HOST_DEVICES is read once per process, so the checks run
in a child interpreter): device counts, peer pairs, buffers and arrays that know their device,
copies between managers on different devices."""
import os
import subprocess
import sys
import textwrap

import pytest

CHILD = textwrap.dedent("""
    import numpy as np, kmm
    n = kmm.device_count("host")
    assert n == int(__import__("os").environ["KMM_HOST_DEVICES"]), n
    ms = [kmm.Manager(backend="host", device=d) for d in range(n)]
    assert [m.device for m in ms] == list(range(n))
    for a in range(n):
        for b in range(n):
            assert kmm.can_access_peer(a, b, "host") == (a != b and a // 2 == b // 2), (a, b)
            if a == b:
                continue
            host = np.random.default_rng(a * 8 + b).random(30000, dtype=np.float32)
            x = ms[a].asarray(host)
            assert x.device == a and x.buffer.device == a
            y = ms[b].alloc(host.nbytes)
            assert y.device == b
            y.copy_from(x.buffer)
            assert np.array_equal(np.frombuffer(y.copy_to_host(), np.float32), host), (a, b)
            x.buffer.close(); y.close()
    # Memory of one device viewed by another device's manager (found by an adversarial run,
    # 2026-11-29: the CAI import took it, and .device named the manager's device).
    if n > 1:
        x = ms[0].asarray(np.arange(8, dtype=np.float32))
        for f in (lambda: kmm.DeviceArray.from_cuda_array_interface(x, manager=ms[1]),
                  lambda: kmm.asarray(x, manager=ms[1])):
            try:
                f()
            except ValueError as e:
                assert "manager = " in str(e) and "device 0" in str(e) and "device is 1" in str(e) or "to device 1" in str(e), e
            else:
                raise AssertionError("device 0's memory taken by device 1's manager")
        assert kmm.asarray(x, manager=ms[0]) is x
        y = kmm.DeviceArray.from_cuda_array_interface(x, manager=ms[0])
        assert y.device == 0 and np.array_equal(y.get(), np.arange(8, dtype=np.float32))
        for f in (lambda: kmm.DeviceArray.from_cuda_array_interface(x.buffer, manager=ms[1]),
                  lambda: kmm.asarray(x.buffer, manager=ms[1])):   # a Buffer says its device too
            try:
                f()
            except ValueError as e:
                assert "device 0" in str(e), e
            else:
                raise AssertionError("device 0's buffer taken by device 1's manager")
        y.buffer.close(); x.buffer.close()
        # The import's producer goes once the stream has passed the import's free (at the
        # manager's next synchronize): then close() below ends the manager at once.
        ms[0].synchronize()
        del x, y, f
    for bad in [(0, n), (-1, 0)]:
        try:
            kmm.can_access_peer(*bad, backend="host")
        except kmm.InvalidArgumentError as e:
            assert "numbered 0 to %d" % (n - 1) in str(e) or "-1" in str(e), e
        else:
            raise AssertionError("accepted %r" % (bad,))
    try:
        kmm.device_count("gpu")
    except kmm.InvalidArgumentError as e:
        assert "backend" in str(e)
    else:
        raise AssertionError("accepted backend 'gpu'")
    live = kmm.live_managers()
    for m in ms:
        m.close()
    assert kmm.live_managers() == live - n
    print("ok", n)
""")


@pytest.mark.parametrize("n", [2, 4])
def test_managers_and_copies_on_several_host_devices(n):
    env = dict(os.environ, KMM_HOST_DEVICES=str(n), KMM_BACKEND="host")
    p = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True,
                       cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.strip() == "ok %d" % n


def test_bad_host_device_count_is_refused():
    env = dict(os.environ, KMM_HOST_DEVICES="0", KMM_BACKEND="host")
    code = "import kmm\ntry:\n    kmm.device_count('host')\nexcept kmm.InvalidArgumentError as e:\n    print(e)\n"
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert "KMM_HOST_DEVICES" in p.stdout and "1..64" in p.stdout, p.stdout + p.stderr
