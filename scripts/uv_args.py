"""pip's configuration as uv arguments, one per line (scripts/setup.sh): uv reads none of pip's files or PIP_*
variables, so the indexes, find-links and constraints pip would use are passed on; ``unsafe-best-match`` makes uv
choose among several indexes as pip does (the newest allowed version from any of them)."""
from __future__ import annotations

import shlex
import subprocess
import sys

FLAGS = {"index-url": "--index-url", "extra-index-url": "--extra-index-url", "find-links": "--find-links",
         "constraint": "--constraint"}


def main() -> None:
    done = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True)
    out = ["--index-strategy", "unsafe-best-match"]
    for line in done.stdout.splitlines():
        key, _, value = line.partition("=")
        flag = FLAGS.get(key.rsplit(".", 1)[-1])
        if flag is None:
            continue
        for item in shlex.split(value)[0].split() if value else ():
            pair = [flag, item]
            if all(out[i:i + 2] != pair for i in range(0, len(out), 2)):
                out += pair
    print("\n".join(out))


if __name__ == "__main__":
    main()
