"""The `flexc` command of the Python package: runs the flexc executable
bundled in the package (flexc/bin/flexc) with the same arguments."""
import os
import sys


def main():
    exe = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "flexc")
    if not os.path.exists(exe):
        sys.exit(f"flexc: the flexc executable is not bundled here ({exe}); "
                 "install the package with `pip install ./python`")
    os.execv(exe, [exe] + sys.argv[1:])


if __name__ == "__main__":
    main()
