"""Voice Studio. With no arguments: the studio window. With a command: the CLI."""

import sys


def main() -> int:
    argv = sys.argv[1:]
    if not argv or argv[0].startswith("-"):  # window options (--screenshot …); commands are words
        from app.ui.main import run

        return run(argv)
    from app.cli.main import main as cli_main

    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
