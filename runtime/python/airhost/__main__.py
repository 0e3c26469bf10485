"""`python -m airhost ...` runs the airhost executable installed with this package."""
import os
import shutil
import sys
import sysconfig


def main() -> None:
    exe = os.path.join(sysconfig.get_path("scripts"), "airhost")
    if not os.access(exe, os.X_OK):
        exe = shutil.which("airhost") or exe
    os.execv(exe, [exe, *sys.argv[1:]])


if __name__ == "__main__":
    main()
