"""``python -m mmfleet_lab.cluster up|down|env|status``: the ``mmfleet cluster`` commands, standalone."""

import argparse
import sys

from mmfleet_lab.cluster.commands import register_cli


def main() -> int:
    top = argparse.ArgumentParser(prog="python -m mmfleet_lab.cluster")
    register_cli(top.add_subparsers(dest="command", required=True))
    args = top.parse_args(["cluster", *sys.argv[1:]])
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
