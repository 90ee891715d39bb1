"""One warm process for the docs run's `depthlens` commands: a fork server and the `depthlens` shim that uses it.

Why: the docs pages start about 90 `depthlens` processes, and each spends about 2.5 s importing torch, xarray and
scipy before it does anything (a quarter of the docs run). Here one server imports them once; each command is a
fork of it that runs the CLI exactly as the installed entry point does (`depthlens.cli:app`), with the caller's
argv, working directory, environment and stdin/stdout/stderr (passed as file descriptors over a Unix socket),
and its exit status goes back to the shim. What a block prints, writes and returns is the same; only the imports
are shared.

Where it would not be the same, the shim runs the real entry point instead (`os.execv`):
* no server is listening (`DEPTHLENS_WARM_SOCKET` unset, or the server is gone);
* the command's environment differs from the server's (beyond the shell's own PWD, OLDPWD, SHLVL, _), because a
  module reads some variables once at import (`HF_HUB_OFFLINE`, `MPLBACKEND`, `OMP_NUM_THREADS`...).

The cold start itself is tested where it matters (tests/test_startup.py and every test that runs the CLI in a
subprocess). Fork safety: the server never runs a torch op (no OpenMP pool exists to be copied into a child) and
serves one connection at a time from one thread; every command runs in its own child, which runs the atexit
handlers, flushes and exits with `os._exit`, so nothing a command changes reaches the next one.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import signal
import socket
import struct
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

# what a depthlens command imports before its first line of work; the server pays for it once
WARM_MODULES = (
    "depthlens.cli",
    "torch",
    "numpy",
    "scipy.stats",
    "xarray",
    "pandas",
    "netCDF4",
    "safetensors.torch",
    "einops",
    "matplotlib.pyplot",
    "seaborn",
    "depthlens.diagnostics.sweep",
    "depthlens.diagnostics.registry",
    "depthlens.studies.study",
    "depthlens.models.model",
    "depthlens.io.checkpoint",
)
VOLATILE_ENV = frozenset({"PWD", "OLDPWD", "SHLVL", "_"})  # the shell sets these per command
SOCKET_ENV = "DEPTHLENS_WARM_SOCKET"

SHIM = """#!{python} -S
# depthlens, run by a fork of the docs run's warm process (tests/warm_cli.py); the real entry point otherwise
import os, sys
sys.path.insert(0, {tests!r})
import warm_cli
sys.exit(warm_cli.client(sys.argv[1:], {real!r}))
"""


def _env_key(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k not in VOLATILE_ENV}


# --- the client (the `depthlens` on the docs run's PATH) -----------------------------------------------------


def client(args: list[str], real: str) -> int:
    """Run `depthlens *args` in a fork of the warm server; exec the real entry point where that would differ."""
    path = os.environ.get(SOCKET_ENV)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        if not path:
            raise OSError("no warm server")
        sock.connect(path)
        request = json.dumps({"argv": [real, *args], "cwd": os.getcwd(), "env": dict(os.environ)}).encode()
        socket.send_fds(sock, [struct.pack("!I", len(request)) + request], [0, 1, 2])
        reply = sock.recv(1)
    except OSError:
        sock.close()
        os.execv(real, [real, *args])
    if reply == b"R":  # the server declined (another environment): the real process
        sock.close()
        os.execv(real, [real, *args])
    status = _recv_exact(sock, 4)
    return struct.unpack("!i", status)[0] if len(status) == 4 else 1  # the child died without a status


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        part = sock.recv(n - len(out))
        if not part:
            break
        out += part
    return out


# --- the server ---------------------------------------------------------------------------------------------


def serve(path: str) -> None:
    """Import the CLI and what its commands import, then fork a child per connection (one at a time)."""
    own_env = _env_key(os.environ)  # before the imports: the environment a cold process starts with
    for name in WARM_MODULES:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    # what those imports put into the environment (netCDF4: HDF5_PLUGIN_PATH), as they would in a cold process
    set_by_imports = {k: v for k, v in os.environ.items() if k not in own_env}
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel; they report their own status
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(8)
    print("ready", flush=True)
    while True:
        conn, _ = listener.accept()
        try:
            head, fds, _flags, _addr = socket.recv_fds(conn, 4, 3)
            request = json.loads(_recv_exact(conn, struct.unpack("!I", head)[0]) if len(head) == 4 else b"{}")
        except (OSError, ValueError):
            conn.close()
            continue
        if len(fds) != 3 or _env_key(request.get("env", {})) != own_env:
            conn.sendall(b"R")
            conn.close()
            for fd in fds:
                os.close(fd)
            continue
        conn.sendall(b"F")
        with open(f"{path}.log", "a") as log:  # what was served warm (tests/test_warm_cli.py reads it)
            log.write(json.dumps(request["argv"][1:]) + "\n")
        if os.fork() == 0:  # the child: becomes the command
            listener.close()
            _run_command(conn, request, fds, set_by_imports, f"{path}.cpu")
        conn.close()
        for fd in fds:
            os.close(fd)


def _run_command(
    conn: socket.socket, request: dict, fds: list[int], set_by_imports: Mapping[str, str], cpu_log: str
) -> None:
    """In the child: take the caller's stdio, directory, environment and argv, run the CLI, append its CPU seconds
    to `cpu_log`, send the status."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # a command waits for its own children (torchrun, git)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), line_buffering=os.isatty(1))
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), errors="backslashreplace", line_buffering=True)
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    for k, v in set_by_imports.items():
        os.environ.setdefault(k, v)
    sys.argv = list(request["argv"])  # argv[0]: the real entry point's path, as a process started from it has
    status = 1
    try:
        from depthlens.cli import app

        app()  # as the console script `depthlens = "depthlens.cli:app"` calls it
        status = 0
    except SystemExit as e:
        status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if e.code is not None and not isinstance(e.code, int):
            print(e.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001  (what an uncaught exception does in a real process)
        import traceback

        traceback.print_exc()
    finally:
        import atexit

        with contextlib.suppress(Exception):  # what interpreter shutdown runs in a real process; os._exit skips it
            atexit._run_exitfuncs()
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        # its CPU time: a child the kernel reaps is counted in no parent's rusage
        with contextlib.suppress(OSError), open(cpu_log, "a") as f:
            f.write(f"{cpu_seconds()}\n")
        with contextlib.suppress(OSError):
            conn.sendall(struct.pack("!i", status))
        os._exit(status)


def cpu_seconds() -> float:
    """User + system CPU seconds of this process and its waited-for children."""
    import resource

    return sum(
        u.ru_utime + u.ru_stime for u in map(resource.getrusage, (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    )


def served_cpu_seconds(env: Mapping[str, str]) -> float:
    """CPU seconds of every command the warm server of `env` has run to the end (each child appends its own):
    its children are reaped by the kernel, so no parent's rusage counts them."""
    try:
        with open(f"{env.get(SOCKET_ENV, '')}.cpu") as f:
            return sum(float(line) for line in f if line.strip())
    except FileNotFoundError:
        return 0.0


@contextlib.contextmanager
def warm_depthlens(env: dict[str, str], cwd: Path, shim_dir: Path) -> Iterator[dict[str, str]]:
    """Start a server for `env` (in `cwd`) and yield `env` with the shim first on PATH and the socket named."""
    shim_dir.mkdir(parents=True, exist_ok=True)
    sock_path = str(shim_dir / "warm.sock")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(sock_path)  # a socket a killed run left behind
    real = str(Path(sys.executable).parent / "depthlens")
    shim = shim_dir / "depthlens"
    shim.write_text(SHIM.format(python=sys.executable, tests=str(Path(__file__).parent), real=real))
    shim.chmod(0o755)
    out = {**env, "PATH": f"{shim_dir}{os.pathsep}{env['PATH']}", SOCKET_ENV: sock_path}
    server = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
            f"import warm_cli; warm_cli.serve({sock_path!r})",
        ],
        cwd=cwd,
        env=out,
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    try:
        line = server.stdout.readline() if server.stdout else b""  # "ready", or b"" if it died importing
        if line.strip() != b"ready":
            raise RuntimeError(f"the warm depthlens server did not start ({line!r})")
        yield out
    finally:
        server.kill()
        server.wait()
        if server.stdout:
            server.stdout.close()
