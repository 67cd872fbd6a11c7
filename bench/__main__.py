"""``python -m bench``: list the benchmarks and what each measures; ``python -m bench NAME [ARGS]`` runs one."""

from __future__ import annotations

import runpy
import sys

from bench.common.registry import benchmarks


def main(argv: list[str]) -> int:
    suite = benchmarks()
    if not argv or argv[0] in ("-h", "--help", "list"):
        width = max(len(b.name) for b in suite)
        print("python -m bench NAME [ARGS] runs one (the same as python -m bench.NAME); NAME --help for its options.\n")
        print("\n".join(f"{b.name:<{width}}  {b.summary}" for b in suite))
        return 0
    name = argv[0]
    if name not in {b.name for b in suite}:
        print(f"no benchmark {name!r}; python -m bench lists them", file=sys.stderr)
        return 2
    sys.argv = [f"python -m bench.{name}", *argv[1:]]
    runpy.run_module(f"bench.{name}", run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
