"""The source tree's layers, checked from the code's own includes (host/README.md draws them).

    include/airhost/   the public API: standard headers and its own, nothing else
    host/base/         utilities: includes no other folder of host/
    host/launch/       the launch library: base and the public API
    host/gpu/          GPU tooling: base and the public API
    host/cli/          the command line: may use every layer
    runtime/           the rank side and the Python extension: base, launch's codecs, gpu; never cli

Inside host/launch/, each concern has a room, and includes run one way only (host/README.md):

    rank/  procs/      include nothing else of launch/
    run/               procs/
    output/            run/ procs/
    watch/             rank/ run/ procs/
    link/              rank/ run/
    supervisor*        every room but link/
    launch_checks.*    rank/ run/ link/
    launcher.cpp       everything

No file of host/ is over 800 lines: a file that grows past it is split by concern.

A file moved to the wrong room, or an include that reaches up a layer, fails here with the
file, the line and the rule."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]', re.M)

# folder -> the folders of host/ (and "airhost" for the public API) its files may include
ALLOWED = {
    "host/base": {"base"},
    "host/launch": {"base", "launch", "airhost"},
    "host/gpu": {"base", "gpu", "airhost"},
    "host/cli": {"base", "launch", "gpu", "cli", "airhost"},
    "runtime": {"base", "launch", "gpu", "airhost"},
}
# Third-party headers that must never show in the public API: an embedding program includes
# <airhost/airhost.hpp> and needs none of libuv, toml++, CPython or pybind11.
PRIVATE_DEPS = ("uv.h", "uv/", "toml++", "Python.h", "pybind11")


def sources(folder: str):
    base = ROOT / folder
    return sorted(p for p in base.rglob("*") if p.suffix in (".cpp", ".hpp", ".h", ".in"))


def includes(path: Path):
    text = path.read_text()
    for m in INCLUDE.finditer(text):
        yield text.count("\n", 0, m.start()) + 1, m.group(1), m.group(2)


def test_every_host_file_lives_in_a_room():
    loose = [p.name for p in (ROOT / "host").iterdir() if p.is_file() and p.name != "README.md"]
    assert not loose, f"files directly in host/ (put each in base/, launch/, gpu/ or cli/): {loose}"
    rooms = sorted(p.name for p in (ROOT / "host").iterdir() if p.is_dir())
    assert rooms == ["base", "cli", "gpu", "launch"], rooms


@pytest.mark.parametrize("folder", sorted(ALLOWED))
def test_includes_follow_the_layers(folder):
    wrong = []
    for path in sources(folder):
        for line, kind, name in includes(path):
            if kind != '"' or "/" not in name:
                continue  # <system> headers, and a room's own files included by bare name (runtime)
            room = name.split("/", 1)[0]
            if room in ("base", "launch", "gpu", "cli", "airhost") and room not in ALLOWED[folder]:
                wrong.append(f"{path.relative_to(ROOT)}:{line}: includes {name} ({folder} may include "
                             f"{', '.join(sorted(ALLOWED[folder]))})")
    assert not wrong, "\n".join(wrong)


# host/launch's rooms -> the rooms of launch/ their files may include (besides their own)
LAUNCH_ROOMS = {
    "rank": set(),
    "procs": set(),
    "run": {"procs"},
    "output": {"run", "procs"},
    "watch": {"rank", "run", "procs"},
    "link": {"rank", "run"},
}
# the files directly in host/launch: the two that put the rooms together (the supervisor, whose
# state and code span four files, and the launcher with its checks)
_SUPERVISOR = {"rank", "procs", "run", "output", "watch", "supervisor.hpp", "supervisor_state.hpp"}
LAUNCH_TOP = {
    "supervisor.hpp": {"rank", "procs", "run", "output", "watch"},
    "supervisor_state.hpp": _SUPERVISOR,
    "supervisor.cpp": _SUPERVISOR,
    "supervisor_ranks.cpp": _SUPERVISOR,
    "supervisor_run.cpp": _SUPERVISOR,
    "launch_checks.hpp": set(),
    "launch_checks.cpp": {"rank", "run", "link", "launch_checks.hpp"},
    "launcher.cpp": {"rank", "procs", "run", "output", "watch", "link", "supervisor.hpp", "launch_checks.hpp"},
}


def launch_room_of(name: str):
    """"launch/rank/frames.hpp" -> "rank"; "launch/supervisor.hpp" -> "supervisor.hpp"."""
    parts = name.split("/")
    return parts[1] if len(parts) > 2 else parts[-1]


def test_launch_rooms_include_one_way():
    launch = ROOT / "host" / "launch"
    rooms = sorted(p.name for p in launch.iterdir() if p.is_dir())
    assert rooms == sorted(LAUNCH_ROOMS), f"host/launch/ has rooms {rooms}; the rules here know {sorted(LAUNCH_ROOMS)}"
    top = sorted(p.name for p in launch.iterdir() if p.is_file())
    assert top == sorted(LAUNCH_TOP), f"files directly in host/launch/: {top} (put each in a room)"
    wrong = []
    for path in sources("host/launch"):
        rel = path.relative_to(launch)
        here = rel.parts[0] if len(rel.parts) > 1 else rel.name
        allowed = LAUNCH_ROOMS.get(here, set()) | {here} if here in LAUNCH_ROOMS else LAUNCH_TOP[here]
        for line, kind, name in includes(path):
            if kind != '"' or not name.startswith("launch/"):
                continue
            room = launch_room_of(name)
            if room not in allowed:
                wrong.append(f"{path.relative_to(ROOT)}:{line}: includes {name} (launch/{here} may include "
                             f"{', '.join(sorted(allowed - {here})) or 'nothing else of launch/'})")
    assert not wrong, "\n".join(wrong)


def test_the_room_rule_catches_an_include_that_runs_back_up(tmp_path, monkeypatch):
    """The check itself: the node link's wire format reaching up into the supervisor is reported."""
    launch = tmp_path / "host" / "launch"
    for room in LAUNCH_ROOMS:
        (launch / room).mkdir(parents=True)
    for name in LAUNCH_TOP:
        (launch / name).write_text("")
    (launch / "watch" / "bad.cpp").write_text('#include "launch/run/run_dir.hpp"\n#include "launch/link/link_wire.hpp"\n')
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    with pytest.raises(AssertionError, match=r"bad.cpp:2: includes launch/link/link_wire.hpp"):
        test_launch_rooms_include_one_way()


def test_host_files_name_their_room_in_includes():
    """Inside host/, includes say the room ("launch/rank/frames.hpp"), so the layer is visible where
    the include is written."""
    bare = []
    for path in sources("host"):
        for line, kind, name in includes(path):
            if kind == '"' and "/" not in name:
                bare.append(f"{path.relative_to(ROOT)}:{line}: {name}")
    assert not bare, "\n".join(bare)


def test_the_public_headers_need_nothing_but_the_standard_library():
    wrong = []
    for path in sources("include/airhost"):
        for line, kind, name in includes(path):
            if kind == '"' and not name.startswith("airhost/"):
                wrong.append(f"{path.relative_to(ROOT)}:{line}: {name} is not a public header")
            if any(dep in name for dep in PRIVATE_DEPS):
                wrong.append(f"{path.relative_to(ROOT)}:{line}: {name} leaks a private dependency")
    assert not wrong, "\n".join(wrong)


def test_the_layer_rule_catches_a_wrong_include(tmp_path, monkeypatch):
    """The check itself: a launch file that includes the CLI is reported."""
    fake = tmp_path / "host" / "launch"
    fake.mkdir(parents=True)
    (fake / "bad.cpp").write_text('#include "launch/rank/frames.hpp"\n#include "cli/config.hpp"\n')
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    with pytest.raises(AssertionError, match=r"bad.cpp:2: includes cli/config.hpp"):
        test_includes_follow_the_layers("host/launch")


MAX_LINES = 800


def test_no_host_file_is_over_800_lines():
    """A file past MAX_LINES holds more than one concern: split it by concern (the supervisor's
    state and its code, node 0's door and the join, node 0's decisions and the link's thread)."""
    long = [f"{p.relative_to(ROOT)}: {n} lines" for p in sources("host")
            if (n := p.read_text().count("\n")) > MAX_LINES]
    assert not long, f"over {MAX_LINES} lines: " + "; ".join(long)
