"""The `kestrel` command (pyproject's entry point), above both packages: with no arguments, or with only the
app's own flags (--no-autoload, --panel), it opens the desktop app (app.main); every other command line
(generate, chat, bench, serve, --help) goes to the engine's commands, engine.cli.main. Qt is imported only
for the app and torch only by the engine commands that load a model. Nothing imports this module."""

from __future__ import annotations

import logging
import sys

APP_FLAGS = ("--no-autoload", "--panel")  # app.main's options
APP_HELP = ("Without a command, kestrel opens the desktop app: kestrel [--no-autoload] [--panel PANEL] "
            "(python -m app --help for its options).")


def opens_the_app(argv: list[str]) -> bool:
    """True for the command lines that open the desktop app: none, or the app's own flags."""
    return not argv or argv[0].split("=", 1)[0] in APP_FLAGS


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if opens_the_app(argv):
        from app.main import main as app_main

        logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
        return app_main(argv)
    from engine import cli as engine_cli

    if argv[0] in ("-h", "--help"):  # the engine's commands, and a word on the app
        parser = engine_cli.build_parser()
        parser.epilog = APP_HELP
        parser.print_help()
        return 0
    return engine_cli.main(argv)


if __name__ == "__main__":
    sys.exit(main())
