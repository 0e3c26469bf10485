"""airhost as a user installs it (issue 30): the wheels and the sdist of dist/, made by
scripts/build-wheels.sh, each installed into a fresh venv the way a user on a GPU node would:

- every wheel (CPython 3.10-3.13) with `pip install --no-index --find-links dist`, with no
  compiler, CMake or pkg-config on PATH, then a 2-rank script that needs no torch, a
  `@distributed` call returning each rank's value and re-raising a rank's exception with its
  traceback, and `airhost doctor --json`;
- on 3.11 (the torch wheel on this machine's disk), the 4-rank DDP example over gloo;
- the sdist, built by pip in a fresh venv with a C++ compiler alone: Debian's libuv and toml++
  hidden in a mount namespace of its own, pkg-config answering nothing;
- `auditwheel show` on every wheel: manylinux_2_28_x86_64, no libpython linked.

scripts/test.sh builds dist/ first and sets AIRHOST_TEST_DIST; without it these tests skip
(a developer's quick run). With it, a wheel missing from dist/ fails them.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DIST = os.environ.get("AIRHOST_TEST_DIST", "")
PYTHONS = ("3.10", "3.11", "3.12", "3.13")
PLAT = "manylinux_2_28_x86_64"
TOOLS = REPO / "build" / "wheel-tools"

pytestmark = [pytest.mark.skipif(not DIST, reason="AIRHOST_TEST_DIST not set (scripts/test.sh builds dist/ and sets it)"),
              pytest.mark.timeout(900)]  # the sdist and the musl check compile: minutes

API_SCRIPT = '''
import os, sys
from airhost import distributed

@distributed(num_accelerators=2, tracking=False)
def rank_value(x):
    return (int(os.environ["RANK"]) + 1) * x, sys.version_info[:2]

@distributed(num_accelerators=2, tracking=False)
def fails_on_rank_1():
    if os.environ["RANK"] == "1":
        raise ValueError("rank one refuses")
    return "ok"

print("values", rank_value.distributed(10))
try:
    fails_on_rank_1.distributed()
except Exception as e:
    print("raised", type(e).__name__, str(e).replace("\\n", " | "))
'''

SCRIPT = "import os, sys\nprint('rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'], 'python', '%d.%d' % sys.version_info[:2], flush=True)\n"


def version() -> str:
    return re.search(r'^version = "(.*)"', (REPO / "pyproject.toml").read_text(), re.M).group(1)


def find_python(v: str) -> str:
    """A CPython `v`: pyenv's, or python`v` on PATH (the same search as build-wheels.sh)."""
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    for candidate in [*sorted(root.glob(f"versions/{v}.*/bin/python{v}")), shutil.which(f"python{v}")]:
        if candidate and os.access(candidate, os.X_OK):
            return str(candidate)
    pytest.fail(f"no CPython {v} on this machine (pyenv install {v})")


def wheel_for(v: str) -> Path:
    name = f"airhost-{version()}-cp{v.replace('.', '')}-cp{v.replace('.', '')}-{PLAT}.whl"
    path = Path(DIST) / name
    assert path.is_file(), f"{name} is not in {DIST}: scripts/build-wheels.sh makes it"
    return path


@pytest.fixture(scope="module")
def deps(tmp_path_factory) -> Path:
    """airhost's own dependencies (pure Python) as wheels, so that installs can use --no-index."""
    out = tmp_path_factory.mktemp("deps")
    r = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", str(out),
                        "cloudpickle>=2.0", "fsspec>=2023.1"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return out


@pytest.fixture(scope="module")
def bare_path(tmp_path_factory) -> Path:
    """A PATH folder with the shell tools a user's node has, and no compiler, CMake or pkg-config."""
    bare = tmp_path_factory.mktemp("bare-bin")
    for tool in ("sh", "bash", "env", "cat", "ls", "rm", "mkdir", "uname", "id", "sleep", "readlink", "dirname",
                 "basename", "grep", "sed", "true", "false", "ps", "kill", "tail", "head"):
        if found := shutil.which(tool):
            (bare / tool).symlink_to(found)
    return bare


def user_env(venv: Path, bare: Path, tmp_path: Path) -> dict[str, str]:
    env = {"HOME": os.environ.get("HOME", str(tmp_path)), "PATH": f"{venv}/bin:{bare}", "LANG": "C.UTF-8",
           "AIRHOST_RUNS_DIR": str(tmp_path / "runs"), "AIRHOST_TRACKING": "0", "AIRHOST_STATE_DIR": str(tmp_path / "state")}
    return env


def pip_install_airhost(pip: list[str], deps: Path, env: dict[str, str] | None = None) -> None:
    """`pip install --no-index` of airhost from dist/ alone, its two needs from `deps`: what a user
    on a node without network does. `pip` is the command and any options of its own ("--user")."""
    r = subprocess.run([*pip, "-q", "--disable-pip-version-check", "--no-index", "--find-links", str(DIST),
                        "--find-links", str(deps), "airhost"], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr


def make_venv(python: str, where: Path) -> Path:
    r = subprocess.run([python, "-m", "venv", str(where)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return where


def check_runs(venv: Path, env: dict[str, str], tmp_path: Path, v: str) -> None:
    """The three things a new user does first: a script on 2 ranks, @distributed, doctor."""
    script = tmp_path / "hello.py"
    script.write_text(SCRIPT)
    r = subprocess.run(["airhost", str(script), "-n", "2"], env=env, capture_output=True, text=True, timeout=300,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    for rank in (0, 1):
        assert f"[rank {rank}] rank {rank} of 2 python {v}" in r.stdout, r.stdout + r.stderr
    api = tmp_path / "api.py"
    api.write_text(API_SCRIPT)
    r = subprocess.run(["python", str(api)], env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    major, minor = v.split(".")
    assert f"values [(10, ({major}, {minor})), (20, ({major}, {minor}))]" in r.stdout, r.stdout + r.stderr
    raised = next(line for line in r.stdout.splitlines() if line.startswith("raised"))
    assert raised.startswith("raised DistributedError"), raised
    assert "rank 1" in raised and "ValueError: rank one refuses" in raised, raised
    assert 'in fails_on_rank_1 |     raise ValueError("rank one refuses")' in raised, raised
    r = subprocess.run(["airhost", "doctor", "--json"], env=env, capture_output=True, text=True, timeout=300)
    report = json.loads(r.stdout)
    assert r.returncode == report["exit_code"], r.stdout + r.stderr
    assert "summary" in report and "gpus" in report, report


def test_every_wheel_is_manylinux_2_28_with_libuv_inside_and_no_libpython_linked(tmp_path):
    for v in PYTHONS:
        wheel = wheel_for(v)
        r = subprocess.run([str(TOOLS / "bin" / "auditwheel"), "show", str(wheel)], capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr
        assert f'consistent with\nthe following platform tag: "{PLAT}"' in r.stdout, r.stdout
        with zipfile.ZipFile(wheel) as z:
            names = z.namelist()
            binaries = [n for n in names if n.endswith((".so", "/airhost", "/airhost-rank"))]
            assert {f"airhost-{version()}.data/scripts/airhost", f"airhost-{version()}.data/scripts/airhost-rank",
                    f"airhost-{version()}.data/data/lib/airhost/libairhost-rank-py.so"} <= set(names), names
            z.extractall(tmp_path / v)
        for b in binaries:
            needed = subprocess.run(["readelf", "-d", str(tmp_path / v / b)], capture_output=True, text=True).stdout
            libs = set(re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", needed))
            assert libs <= {"libc.so.6", "libm.so.6", "libpthread.so.0", "libdl.so.2", "librt.so.1",
                            "ld-linux-x86-64.so.2"}, (b, libs)  # no libpython, libuv, libstdc++
            exported = subprocess.run(["readelf", "--dyn-syms", "-W", str(tmp_path / v / b)], capture_output=True,
                                      text=True).stdout
            if b.endswith(".so"):
                # The static C++ runtime and libuv stay private: one entry point each.
                globals_ = {line.split()[-1] for line in exported.splitlines()
                            if " GLOBAL " in line and " UND " not in line}
                assert globals_ <= {"PyInit__native", "airhost_rank_main"}, (b, sorted(globals_)[:20])


@pytest.mark.parametrize("v", PYTHONS)
def test_the_wheel_installs_with_no_compiler_and_runs_a_script_the_api_and_doctor(v, deps, bare_path, tmp_path):
    venv = make_venv(find_python(v), tmp_path / "venv")
    env = user_env(venv, bare_path, tmp_path)
    for tool in ("cc", "c++", "gcc", "g++", "clang", "cmake", "pkg-config", "ninja"):
        assert shutil.which(tool, path=env["PATH"]) is None, f"{tool} is reachable; the install must not need it"
    pip_install_airhost(["pip", "install"], deps, env)
    assert (venv / "lib" / "airhost" / "libairhost-rank-py.so").is_file()
    check_runs(venv, env, tmp_path, v)


def test_the_wheel_runs_the_ddp_example_on_4_ranks_over_gloo(deps, bare_path, tmp_path):
    venv = make_venv(find_python("3.11"), tmp_path / "venv")
    # torch first, as a user's node has it (this machine's CPU wheel, from its disk), then
    # airhost from dist/ alone.
    r = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", "torch==2.13.0",
                        "numpy"], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    env = user_env(venv, bare_path, tmp_path)
    pip_install_airhost(["pip", "install"], deps, env)
    # The CLI (exit 0 only when the loss converged), then the same through @distributed, which
    # also checks that the 4 ranks end with the same weights.
    r = subprocess.run(["airhost", str(REPO / "examples" / "mlp_ddp.py"), "--accelerators", "4"],
                       env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"^\[rank 0\] final loss 0\.0", r.stdout, re.M), r.stdout
    r = subprocess.run(["python", str(REPO / "examples" / "mlp_ddp.py"), "--via-api", "--accelerators", "4"],
                       env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert len(re.findall(r"^rank \d \(gloo, cpu\): final loss", r.stdout, re.M)) == 4, r.stdout
    assert "the ranks hold the same weights" in r.stdout, r.stdout


def test_the_sdist_builds_with_a_compiler_alone_and_runs(deps, bare_path, tmp_path):
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("hiding the system's libuv and toml++ takes a mount namespace: root and util-linux's unshare")
    sdist = Path(DIST) / f"airhost-{version()}.tar.gz"
    assert sdist.is_file(), f"{sdist} missing: scripts/build-wheels.sh makes it"
    venv = make_venv(find_python("3.11"), tmp_path / "venv")
    hidden_dirs = [d for d in ("/usr/include/toml++", "/usr/include/uv", "/usr/lib/x86_64-linux-gnu/cmake/libuv",
                               "/usr/lib/x86_64-linux-gnu/cmake/tomlplusplus") if os.path.isdir(d)]
    hidden_files = [str(p) for pattern in ("/usr/include/uv.h", "/usr/lib/x86_64-linux-gnu/libuv*",
                                           "/usr/lib/x86_64-linux-gnu/pkgconfig/libuv*.pc",
                                           "/usr/lib/x86_64-linux-gnu/libtomlplusplus*")
                    for p in Path("/").glob(pattern.lstrip("/"))]
    no_pkg_config = [p for p in ("/usr/bin/pkg-config", "/usr/bin/pkgconf", "/usr/bin/x86_64-linux-gnu-pkg-config")
                     if os.path.exists(p)]
    empty = tmp_path / "empty"
    empty.mkdir()
    hide = [f"mount --bind {empty} {d}" for d in hidden_dirs] + [f"mount --bind /dev/null {f}" for f in hidden_files]
    hide += [f"mount --bind /bin/false {p}" for p in no_pkg_config]
    check = "test ! -s /usr/include/uv.h && ! pkg-config --exists libuv"
    build = f"{venv}/bin/pip install -q --disable-pip-version-check --find-links {deps} {sdist}"
    r = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-ec", " && ".join([*hide, check, build])],
                       capture_output=True, text=True, timeout=1500)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert (venv / "lib" / "airhost" / "libairhost-rank-py.so").is_file()
    native = next(venv.rglob("_native*.so"))
    needed = subprocess.run(["readelf", "-d", str(native)], capture_output=True, text=True).stdout
    assert "libuv" not in needed, "built from the sdist's own libuv, static"
    check_runs(venv, user_env(venv, bare_path, tmp_path), tmp_path, "3.11")


def test_a_python_with_no_shared_libpython_is_told_so_in_one_sentence(deps, bare_path, tmp_path):
    # A FAKE interpreter, named as such: the venv's real Python, told by a sitecustomize that it
    # was built without --enable-shared (every Python here has a shared libpython), given to the
    # wheel's airhost with --python. Its libpython sits where airhost-rank would look first, so
    # that is hidden from it by pointing the fake's prefix elsewhere: the fake lives in a folder
    # of its own.
    venv = make_venv(find_python("3.11"), tmp_path / "venv")
    env = user_env(venv, bare_path, tmp_path)
    pip_install_airhost(["pip", "install"], deps, env)
    fake = tmp_path / "fake-static" / "bin"
    fake.mkdir(parents=True)
    (fake / "sitecustomize.py").write_text("import sysconfig\nsysconfig.get_config_vars()['Py_ENABLE_SHARED'] = 0\n")
    python = fake / "python3.11"
    python.write_text(f"#!/bin/sh\nPYTHONPATH={fake} exec {venv}/bin/python \"$@\"\n")
    python.chmod(0o755)
    script = tmp_path / "hello.py"
    script.write_text(SCRIPT)
    r = subprocess.run(["airhost", str(script), "-n", "1", "--python", str(python)], env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 1, r.stdout + r.stderr
    out = r.stdout + r.stderr
    assert f"the Python at {python} (3.11) has no shared libpython: it was built without --enable-shared" in out, out
    assert "PYTHON_CONFIGURE_OPTS=--enable-shared" in out, out


def test_a_python_older_than_3_10_is_refused_by_pip_in_one_sentence(tmp_path):
    # Python 3.9 has no wheel; the sdist declares the Pythons it supports, so pip refuses it
    # before building anything.
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    old = next(iter(sorted(root.glob("versions/3.9.*/bin/python3.9"))), None) or shutil.which("python3.9")
    if not old:
        pytest.skip("no Python 3.9 here (pyenv install 3.9)")
    venv = make_venv(str(old), tmp_path / "venv")
    r = subprocess.run([str(venv / "bin" / "pip"), "install", "--disable-pip-version-check",
                        str(Path(DIST) / f"airhost-{version()}.tar.gz")], capture_output=True, text=True, timeout=600)
    assert r.returncode != 0
    assert "requires a different Python" in r.stdout + r.stderr and ">=3.10" in r.stdout + r.stderr, r.stdout + r.stderr


def test_a_musl_system_is_refused_by_the_build_in_one_sentence(tmp_path):
    # Alpine's musl, as Zig's clang targets it (the wheel build's own compiler, in
    # build/wheel-tools): the configure step says what is wrong and what to use. The compilers
    # link with -nostdlib: a first link against musl makes Zig build musl and libc++ for it
    # (~100 CPU-s), and the check under test needs the C library's headers only. The same
    # wrappers for glibc pass the check: it is the C library that is refused, not the link.
    zig = next(iter(TOOLS.glob("lib/python3*/site-packages/ziglang/zig")), None)
    assert zig, "scripts/build-wheels.sh installs ziglang into build/wheel-tools"

    def configure(target: str) -> subprocess.CompletedProcess:
        for tool in ("cc", "c++"):
            wrapper = tmp_path / f"{target}-{tool}"
            wrapper.write_text(f"#!/bin/sh\ncase \" $* \" in *\" -c \"*) ;; *) set -- -nostdlib \"$@\" ;; esac\n"
                               f"exec {zig} {tool} -target {target} \"$@\"\n")
            wrapper.chmod(0o755)
        env = dict(os.environ, CC=str(tmp_path / f"{target}-cc"), CXX=str(tmp_path / f"{target}-c++"))
        return subprocess.run(["cmake", "-S", str(REPO), "-B", str(tmp_path / target), "-DAIRHOST_BUILD_TESTS=OFF"],
                              env=env, capture_output=True, text=True, timeout=600)

    r = configure("x86_64-linux-musl")
    assert r.returncode != 0
    assert "this system's C library is not glibc (musl, as on Alpine?)" in r.stderr, r.stderr
    assert r.stderr.count("CMake Error") == 1, r.stderr
    glibc = configure("x86_64-linux-gnu.2.28")
    assert "Performing Test AIRHOST_HAS_GLIBC - Success" in glibc.stdout, glibc.stdout + glibc.stderr
    assert "not glibc" not in glibc.stderr, glibc.stderr


MAPS = ("import os, sys\nlibs = sorted({l.split()[-1] for l in open('/proc/self/maps') if 'libpython' in l})\n"
        "print('rank', os.environ['RANK'], 'prefix', sys.prefix, 'libpython', *libs, flush=True)\n")


def rank_libpythons(airhost: str, env: dict[str, str], tmp_path: Path) -> list[tuple[str, str]]:
    """(sys.prefix, the libpython mapped) of each of 2 ranks of `airhost`."""
    (tmp_path / "maps.py").write_text(MAPS)
    r = subprocess.run([airhost, str(tmp_path / "maps.py"), "-n", "2"], env=env, capture_output=True, text=True,
                       timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    found = re.findall(r"^\[rank \d\] rank \d prefix (\S+) libpython (\S+)$", r.stdout, re.M)
    assert len(found) == 2, r.stdout
    return found


@pytest.mark.skipif(not os.path.exists("/usr/bin/python3.11"), reason="Debian's python3.11 is not installed here")
def test_over_debians_python3_the_ranks_embed_debians_libpython_from_its_multiarch_folder(deps, tmp_path):
    # Debian's python3 links libpython statically; its shared one (package libpython3.11) is in
    # /usr/lib/x86_64-linux-gnu, where the interpreter's sysconfig says it is.
    venv = make_venv("/usr/bin/python3.11", tmp_path / "venv")
    pip_install_airhost([str(venv / "bin" / "pip"), "install"], deps)
    env = {"HOME": str(tmp_path), "PATH": f"{venv}/bin:/usr/bin:/bin", "AIRHOST_TRACKING": "0",
           "AIRHOST_RUNS_DIR": str(tmp_path / "runs")}
    for prefix, lib in rank_libpythons(str(venv / "bin" / "airhost"), env, tmp_path):
        assert prefix == str(venv)
        assert os.path.realpath(lib) == os.path.realpath("/usr/lib/x86_64-linux-gnu/libpython3.11.so.1.0"), lib


def test_a_venv_made_with_copies_and_a_user_install_find_their_pythons_libpython(deps, tmp_path):
    # --copies: the venv's python is no link to follow; pyvenv.cfg's home names the base.
    base = find_python("3.12")
    libdir = os.path.realpath(os.path.join(os.path.dirname(os.path.realpath(base)), "..", "lib"))
    venv = tmp_path / "venv"
    r = subprocess.run([base, "-m", "venv", "--copies", str(venv)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert not (venv / "bin" / "python3.12").is_symlink()
    pip_install_airhost([str(venv / "bin" / "pip"), "install"], deps)
    env = {"HOME": str(tmp_path), "PATH": f"{venv}/bin:/usr/bin:/bin", "AIRHOST_TRACKING": "0",
           "AIRHOST_RUNS_DIR": str(tmp_path / "runs")}
    for prefix, lib in rank_libpythons(str(venv / "bin" / "airhost"), env, tmp_path):
        assert prefix == str(venv) and os.path.realpath(lib) == os.path.join(libdir, "libpython3.12.so.1.0"), (prefix, lib)
    # pip install --user: airhost in ~/.local/bin, the rank's half in ~/.local/lib/airhost, and
    # no python beside them: the python3.12 on PATH is the one.
    user = tmp_path / "userbase"
    env_user = {"HOME": str(tmp_path), "PYTHONUSERBASE": str(user), "AIRHOST_TRACKING": "0",
                "PATH": f"{user}/bin:{os.path.dirname(base)}:/usr/bin:/bin", "AIRHOST_RUNS_DIR": str(tmp_path / "runs2")}
    pip_install_airhost([base, "-m", "pip", "install", "--user"], deps, env_user)
    assert (user / "lib" / "airhost" / "libairhost-rank-py.so").is_file()
    for prefix, lib in rank_libpythons(str(user / "bin" / "airhost"), env_user, tmp_path):
        assert os.path.realpath(lib) == os.path.join(libdir, "libpython3.12.so.1.0"), (prefix, lib)
    r = subprocess.run([base, "-c", API_SCRIPT], env=env_user, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0 and "values [(10, (3, 12)), (20, (3, 12))]" in r.stdout, r.stdout + r.stderr
