"""Voice Studio. With no arguments: the studio window. With a command: the CLI."""

import sys


def main() -> int:
    argv = sys.argv[1:]
    if argv in (["--version"], ["-V"]):
        from app import __version__

        print(f"Voice Studio {__version__}")
        return 0
    from app.core import paths

    if paths.bundled_models_dir():  # an app bundle's first start installs its stock voices
        from app.engine.errors import VoiceStudioError
        from app.models import manager

        try:
            manager.install_bundled()
        except (OSError, VoiceStudioError) as exc:  # a damaged bundle's voices: the app still starts
            print(f"warning: the app bundle's stock voices could not be installed: {exc}", file=sys.stderr)
    if not argv or argv[0].startswith("-"):  # window options (--screenshot …); commands are words
        try:
            from app.ui.main import run
        except ImportError as exc:  # Qt's libraries need the desktop's own (OpenGL's, X11's)
            if "cannot open shared object file" not in str(exc):
                raise
            print(
                f"error: the studio's window needs a library this system lacks: {exc}.\n"
                "Install the desktop's OpenGL and X11 libraries (on Debian and Ubuntu: libgl1 libegl1 "
                "libxkbcommon0 libfontconfig1); the command line works without them (--help).",
                file=sys.stderr,
            )
            return 1
        return run(argv)
    from app.cli.main import main as cli_main

    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
